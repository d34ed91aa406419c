"""Current and maximum SM and memory clocks (MHz)."""

from __future__ import annotations

import pynvml

from agent.nvml.session import optional
from agent.sample import GpuSample


def read(handle, gpu: GpuSample) -> None:
    gpu.sm_clock_mhz = optional(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM)
    gpu.sm_clock_max_mhz = optional(pynvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_SM)
    gpu.mem_clock_mhz = optional(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_MEM)
    gpu.mem_clock_max_mhz = optional(pynvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_MEM)
