"""SM, memory and video clocks (MHz): the current ones, and the board's maximum (read once per GPU)."""

from __future__ import annotations

import pynvml

from agent.nvml.session import optional
from agent.sample import GpuSample


def read(handle, gpu: GpuSample) -> None:
    gpu.sm_clock_mhz = optional(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM)
    gpu.mem_clock_mhz = optional(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_MEM)
    gpu.video_clock_mhz = optional(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_VIDEO)


def read_max(handle, gpu: GpuSample) -> None:
    # The board's limits, not the application clocks: fixed while the GPU is on the bus.
    gpu.sm_clock_max_mhz = optional(pynvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_SM)
    gpu.mem_clock_max_mhz = optional(pynvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_MEM)
