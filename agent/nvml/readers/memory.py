"""Framebuffer memory used / total / reserved, in bytes."""

from __future__ import annotations

import pynvml
from pynvml import NVMLError

from agent.nvml.session import UNSUPPORTED_CODES
from agent.sample import GpuSample

# What a driver without the v2 struct answers: no such function (before r510), or a version it
# does not know.
_NO_V2 = UNSUPPORTED_CODES | {pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH}


def read(handle, gpu: GpuSample) -> None:
    # v2 splits what the driver and firmware reserve out of "used"; mem_used_bytes keeps the v1
    # meaning (allocated + reserved), so it means the same whichever struct the driver has. The
    # reserved part is constant per GPU and so does not disturb peer comparison.
    try:
        mem = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    except NVMLError as err:
        if err.value not in _NO_V2:
            raise
    else:
        gpu.mem_used_bytes = int(mem.used) + int(mem.reserved)
        gpu.mem_total_bytes = int(mem.total)
        gpu.mem_reserved_bytes = int(mem.reserved)
        return
    mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
    gpu.mem_used_bytes = int(mem.used)
    gpu.mem_total_bytes = int(mem.total)
