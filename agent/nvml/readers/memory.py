"""Framebuffer memory used / total, in bytes."""

from __future__ import annotations

import pynvml

from agent.sample import GpuSample


def read(handle, gpu: GpuSample) -> None:
    # The v1 struct: available on every driver; "used" includes the driver-reserved part,
    # which is constant per GPU and so does not disturb peer comparison.
    mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
    gpu.mem_used_bytes = int(mem.used)
    gpu.mem_total_bytes = int(mem.total)
