"""GPM (GPU Performance Monitoring, Hopper+): tensor, graphics-engine and DRAM activity.

Metrics come from two samples: the activity counters' growth over the time between them.
Only the metrics in GPM_METRICS are simulated; other metric ids answer NOT_SUPPORTED in their
own entry, as NVML does per metric.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_void_p
from typing import Any

import pynvml as N

from agent.sim.gpu import SimGpu
from agent.sim.libnvml.abi import DEV, GPM_SAMPLE, Exports, NvmlReturn, put, require
from agent.sim.libnvml.driver import Driver

EXPORTS = Exports()


class _GpmSample:
    """What nvmlGpmSampleGet snapshots: the sim clock and the activity counters (seconds)."""

    def __init__(self, address: int) -> None:
        self.address = address
        self.gpu: SimGpu | None = None  # None until filled by nvmlGpmSampleGet
        self.ts = 0.0
        self.tensor_active_s = 0.0
        self.gr_active_s = 0.0
        self.dram_active_s = 0.0


# metric id -> (the _GpmSample / Counters attribute, the GpuState percent, metricInfo names and unit)
GPM_METRICS: dict[int, tuple[str, str, tuple[bytes, bytes, bytes]]] = {
    N.NVML_GPM_METRIC_ANY_TENSOR_UTIL: ("tensor_active_s", "tensor_active_pct",
                                        (b"any_tensor_util", b"Percentage of time the SMs were doing any tensor operations", b"%")),
    N.NVML_GPM_METRIC_GRAPHICS_UTIL: ("gr_active_s", "gr_engine_active_pct",
                                      (b"graphics_util", b"Percentage of time any compute/graphics app was active on the GPU", b"%")),
    N.NVML_GPM_METRIC_DRAM_BW_UTIL: ("dram_active_s", "dram_active_pct",
                                     (b"dram_bw_util", b"Percentage of DRAM bandwidth used vs theoretical maximum", b"%")),
}


def _gpm_device(driver: Driver, handle: int) -> SimGpu:
    gpu = driver.device(handle)
    if not gpu.model.gpm:
        raise NvmlReturn(N.NVML_ERROR_NOT_SUPPORTED)
    return gpu


@EXPORTS.c(DEV, POINTER(N.c_nvmlGpmSupport_t))
def _nvmlGpmQueryDeviceSupport(driver: Driver, handle: int, out: Any) -> None:
    # Like NVML: a GPU without GPM is a successful answer with isSupportedDevice = 0.
    gpu = driver.device(handle)
    support = require(out)
    if support.version != N.NVML_GPM_SUPPORT_VERSION:
        raise NvmlReturn(N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    support.isSupportedDevice = int(gpu.model.gpm)


@EXPORTS.c(POINTER(N.c_nvmlGpmSample_t))
def _nvmlGpmSampleAlloc(driver: Driver, out: Any) -> None:
    driver.initialized_node()
    if not out:
        raise NvmlReturn(N.NVML_ERROR_INVALID_ARGUMENT)
    with driver.lock:
        sample = driver.gpm_samples.new(_GpmSample)
    put(out, ctypes.cast(c_void_p(sample.address), N.c_nvmlGpmSample_t))


@EXPORTS.c(GPM_SAMPLE)
def _nvmlGpmSampleFree(driver: Driver, address: int) -> None:
    with driver.lock:
        driver.gpm_samples.free(address)


@EXPORTS.c(DEV, GPM_SAMPLE)
def _nvmlGpmSampleGet(driver: Driver, handle: int, address: int) -> None:
    gpu = _gpm_device(driver, handle)
    sample = driver.gpm_samples.get(address)
    c = gpu.counters
    with gpu.node.lock:
        sample.gpu, sample.ts = gpu, gpu.node.last_ts or 0.0
        sample.tensor_active_s, sample.gr_active_s, sample.dram_active_s = c.tensor_active_s, c.gr_active_s, c.dram_active_s


def _gpm_util(first: _GpmSample, second: _GpmSample, counter: str, current: str) -> float:
    dt = second.ts - first.ts
    if dt <= 0:
        # Two samples at the same simulated instant: the activity right now, as a real
        # pair taken moments apart would measure.
        return float(getattr(second.gpu.state, current))
    return max(0.0, min(100.0, 100.0 * (getattr(second, counter) - getattr(first, counter)) / dt))


@EXPORTS.c(POINTER(N.c_nvmlGpmMetricsGet_t))
def _nvmlGpmMetricsGet(driver: Driver, request: Any) -> None:
    req = require(request)
    if req.version != N.NVML_GPM_METRICS_GET_VERSION:
        raise NvmlReturn(N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    if req.numMetrics > len(req.metrics):
        raise NvmlReturn(N.NVML_ERROR_INVALID_ARGUMENT)
    first = driver.gpm_samples.get(ctypes.cast(req.sample1, c_void_p).value)
    second = driver.gpm_samples.get(ctypes.cast(req.sample2, c_void_p).value)
    if first.gpu is None or second.gpu is not first.gpu:
        raise NvmlReturn(N.NVML_ERROR_INVALID_ARGUMENT)  # unfilled, or from two different GPUs
    driver.check(first.gpu)
    for i in range(req.numMetrics):
        metric = req.metrics[i]
        known = GPM_METRICS.get(metric.metricId)
        if known is None:
            metric.nvmlReturn = N.NVML_ERROR_NOT_SUPPORTED
            continue
        counter, current, info = known
        metric.value = _gpm_util(first, second, counter, current)
        metric.metricInfo.shortName, metric.metricInfo.longName, metric.metricInfo.unit = info
        metric.nvmlReturn = N.NVML_SUCCESS

