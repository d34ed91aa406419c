"""GPU core temperature and, where the GPU has a sensor for it (HBM parts), memory temperature."""

from __future__ import annotations

import pynvml
from pynvml import NVMLError

from agent.nvml.session import field_values, optional
from agent.sample import GpuSample


def _gpu_temp(handle) -> int | None:
    # nvmlDeviceGetTemperature is deprecated (gone in CUDA 14); the V entry point is only
    # in drivers >= 535, so fall back when the library does not have it.
    try:
        return pynvml.nvmlDeviceGetTemperatureV(handle, pynvml.NVML_TEMPERATURE_GPU)
    except NVMLError as err:
        if err.value != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
            raise
    return optional(pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU)


def read(handle, gpu: GpuSample) -> None:
    temp = _gpu_temp(handle)
    gpu.temp_c = None if temp is None else float(temp)
    # Memory temperature has no dedicated getter; it is a field value, unsupported on GDDR parts.
    (mem,) = field_values(handle, [pynvml.NVML_FI_DEV_MEMORY_TEMP])
    gpu.mem_temp_c = None if mem is None else float(mem)
