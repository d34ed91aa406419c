"""GPU and memory-controller utilization (% of the last sample period)."""

from __future__ import annotations

import pynvml

from agent.sample import GpuSample


def read(handle, gpu: GpuSample) -> None:
    # One call answers both; NotSupported leaves both None (the source handles that).
    util = pynvml.nvmlDeviceGetUtilizationRates(handle)
    gpu.util_gpu_pct = float(util.gpu)
    gpu.util_mem_pct = float(util.memory)
