"""Thermals, power, clocks, utilization, memory and the clock-event (throttle) reasons."""

from __future__ import annotations

from ctypes import POINTER, c_uint, c_ulonglong
from typing import Any

import pynvml as N

from agent.sim.gpu import SimGpu
from agent.sim.libnvml.abi import DEV, Exports, NvmlReturn, put, require
from agent.sim.libnvml.driver import Driver

EXPORTS = Exports()

_VIDEO_CLOCK_RATIO = 1545 / 1980  # H100 max video/SM clock


@EXPORTS.c(DEV, N._nvmlTemperatureSensors_t, POINTER(c_uint))
def _nvmlDeviceGetTemperature(driver: Driver, handle: int, sensor: int, out: Any) -> None:
    gpu = driver.device(handle)
    if sensor != N.NVML_TEMPERATURE_GPU:
        raise NvmlReturn(N.NVML_ERROR_NOT_SUPPORTED)
    put(out, round(gpu.state.temp_c))


@EXPORTS.c(DEV, POINTER(N.c_nvmlTemperature_v1_t))
def _nvmlDeviceGetTemperatureV(driver: Driver, handle: int, out: Any) -> None:
    gpu = driver.device(handle)
    t = require(out)
    if t.version != N.nvmlTemperature_v1:
        raise NvmlReturn(N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    if t.sensorType != N.NVML_TEMPERATURE_GPU:
        raise NvmlReturn(N.NVML_ERROR_NOT_SUPPORTED)
    t.temperature = round(gpu.state.temp_c)


@EXPORTS.c(DEV, POINTER(c_uint))
def _nvmlDeviceGetPowerUsage(driver: Driver, handle: int, out: Any) -> None:
    put(out, round(driver.device(handle).state.power_w * 1000))


@EXPORTS.c(DEV, POINTER(c_uint))
def _nvmlDeviceGetEnforcedPowerLimit(driver: Driver, handle: int, out: Any) -> None:
    put(out, round(driver.device(handle).state.power_limit_w * 1000))


@EXPORTS.c(DEV, POINTER(c_ulonglong))
def _nvmlDeviceGetTotalEnergyConsumption(driver: Driver, handle: int, out: Any) -> None:
    # mJ since the driver loaded: power integrated over the simulated clock, never decreasing.
    put(out, int(driver.device(handle).counters.energy_mj))


def _clock(gpu: SimGpu, clock_type: int, current: bool) -> int:
    m, s = gpu.model, gpu.state
    sm = int(s.sm_clock_mhz) if current else m.sm_clock_max_mhz
    if clock_type in (N.NVML_CLOCK_SM, N.NVML_CLOCK_GRAPHICS):
        return sm
    if clock_type == N.NVML_CLOCK_MEM:
        return s.mem_clock_mhz if current else m.mem_clock_max_mhz
    if clock_type == N.NVML_CLOCK_VIDEO:
        return round(sm * _VIDEO_CLOCK_RATIO)
    raise NvmlReturn(N.NVML_ERROR_INVALID_ARGUMENT)


@EXPORTS.c(DEV, N._nvmlClockType_t, POINTER(c_uint))
def _nvmlDeviceGetClockInfo(driver: Driver, handle: int, clock_type: int, out: Any) -> None:
    put(out, _clock(driver.device(handle), clock_type, current=True))


@EXPORTS.c(DEV, N._nvmlClockType_t, POINTER(c_uint))
def _nvmlDeviceGetMaxClockInfo(driver: Driver, handle: int, clock_type: int, out: Any) -> None:
    put(out, _clock(driver.device(handle), clock_type, current=False))


@EXPORTS.c(DEV, POINTER(N.c_nvmlUtilization_t))
def _nvmlDeviceGetUtilizationRates(driver: Driver, handle: int, out: Any) -> None:
    gpu = driver.device(handle)
    rates = require(out)
    rates.gpu, rates.memory = gpu.state.util_gpu, gpu.state.util_mem


# The video engines' sampling period (µs) NVML reports along with their utilization.
_VIDEO_SAMPLING_PERIOD_US = 167_000


@EXPORTS.c(DEV, POINTER(c_uint), POINTER(c_uint))
def _nvmlDeviceGetEncoderUtilization(driver: Driver, handle: int, util: Any, period_us: Any) -> None:
    gpu = driver.device(handle)
    put(util, int(gpu.enc_util))
    put(period_us, _VIDEO_SAMPLING_PERIOD_US)


@EXPORTS.c(DEV, POINTER(c_uint), POINTER(c_uint))
def _nvmlDeviceGetDecoderUtilization(driver: Driver, handle: int, util: Any, period_us: Any) -> None:
    gpu = driver.device(handle)
    put(util, int(gpu.dec_util))
    put(period_us, _VIDEO_SAMPLING_PERIOD_US)


@EXPORTS.c(DEV, POINTER(N.c_nvmlMemory_t))
def _nvmlDeviceGetMemoryInfo(driver: Driver, handle: int, out: Any) -> None:
    # v1: "used" is allocated + reserved (the state's mem_used_bytes, the reserved part included).
    gpu = driver.device(handle)
    mem = require(out)
    total, used = gpu.model.memory_total_bytes, gpu.state.mem_used_bytes
    mem.total, mem.used, mem.free = total, used, total - used


@EXPORTS.c(DEV, POINTER(N.c_nvmlMemory_v2_t))
def _nvmlDeviceGetMemoryInfo_v2(driver: Driver, handle: int, out: Any) -> None:
    # v2 splits the driver's and firmware's reservation out of "used": total = reserved + used +
    # free, as `nvidia-smi -q` shows it (realdata H100: 81559 = 551 reserved + 0 used + 81007 free, MiB).
    gpu = driver.device(handle)
    mem = require(out)
    if mem.version != N.nvmlMemory_v2:
        raise NvmlReturn(N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    total, used, reserved = gpu.model.memory_total_bytes, gpu.state.mem_used_bytes, gpu.model.memory_reserved_bytes
    mem.total, mem.reserved, mem.used, mem.free = total, reserved, max(0, used - reserved), total - max(used, reserved)


@EXPORTS.c(DEV, POINTER(c_ulonglong))
def _nvmlDeviceGetCurrentClocksEventReasons(driver: Driver, handle: int, out: Any) -> None:
    put(out, driver.device(handle).state.reasons)


@EXPORTS.c(DEV, POINTER(c_ulonglong))
def _nvmlDeviceGetCurrentClocksThrottleReasons(driver: Driver, handle: int, out: Any) -> None:
    put(out, driver.device(handle).state.reasons)

