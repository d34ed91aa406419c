"""GPM (GPU Performance Monitoring, Hopper and newer) metrics: tensor-pipe activity, and the
graphics/compute engine's and DRAM's activity behind dcgm-exporter's DCGM_FI_PROF_GR_ENGINE_ACTIVE
and DCGM_FI_PROF_DRAM_ACTIVE.

GPM computes a metric from two samples taken at different times, so this reader keeps state
between sampling cycles: per GPU, the sample of the previous cycle and a spare buffer. Each
cycle takes one nvmlGpmSampleGet into the spare and asks one nvmlGpmMetricsGet for every metric
in METRICS between the previous sample and it: each averaged over the whole sampling interval.
The first cycle (and the first after a GPU came back with a new handle) has nothing to
compare with and leaves the fields None. A GPU without GPM is asked once and then skipped. A
metric the GPU does not have answers NotSupported in its own entry and leaves only its field None.

The state belongs to one NvmlGpuSource (see Reader.per_source): two sources reading the same
GPU must not take each other's previous sample.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import Any

import pynvml
from pynvml import NVMLError

from agent.nvml.session import UNSUPPORTED_CODES, is_unsupported
from agent.sample import GpuSample

# GPM metric id -> the GpuSample field it fills (all percent, 0-100).
METRICS: dict[int, str] = {
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: "tensor_active_pct",  # any tensor pipe (HMMA, IMMA, DMMA) active
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: "gr_engine_active_pct",  # any graphics/compute work on the GPU
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: "dram_active_pct",  # DRAM bandwidth used vs the theoretical maximum
}


def handle_address(handle: Any) -> int | None:
    """The nvmlDevice_t pointer value: a GPU that was reset comes back with another one."""
    return ctypes.cast(handle, ctypes.c_void_p).value


@dataclass(slots=True)
class _GpuState:
    handle: int | None  # the handle the samples were taken through
    last: Any  # nvmlGpmSample_t: the previous cycle's sample once `filled`
    spare: Any  # nvmlGpmSample_t that the next cycle fills
    filled: bool = False


class TensorActivity:
    """The per-source state and the reader over it; close() frees every GPM sample."""

    def __init__(self) -> None:
        self._gpus: dict[int, _GpuState] = {}
        self._unsupported: set[int] = set()  # GPU indexes without GPM: not asked again

    def read(self, handle: Any, gpu: GpuSample) -> None:
        if gpu.index in self._unsupported:
            return
        state = self._gpus.get(gpu.index) or self._start(handle, gpu.index)
        if state is None:
            return
        address = handle_address(handle)
        if state.handle != address:
            # A new handle means the GPU was reset: its counters restarted, so the sample from
            # before cannot be compared with one from after.
            state.handle, state.filled = address, False
        pynvml.nvmlGpmSampleGet(handle, state.spare)
        state.last, state.spare = state.spare, state.last
        if not state.filled:
            state.filled = True
            return
        for field, value in _metrics(state.spare, state.last).items():
            setattr(gpu, field, value)

    def _start(self, handle: Any, index: int) -> _GpuState | None:
        """Allocate this GPU's two samples, or remember that it has no GPM."""
        try:
            supported = bool(pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
        except NVMLError as err:
            if not is_unsupported(err):
                raise  # lost, or a transient error: ask again next cycle
            supported = False  # NotSupported, or a driver without the GPM functions
        if not supported:
            self._unsupported.add(index)
            return None
        first = pynvml.nvmlGpmSampleAlloc()
        try:
            second = pynvml.nvmlGpmSampleAlloc()
        except NVMLError:
            _free(first)
            raise
        state = self._gpus[index] = _GpuState(handle_address(handle), last=first, spare=second)
        return state

    def close(self) -> None:
        """Free every sample; the source calls it before nvmlShutdown."""
        states, self._gpus = list(self._gpus.values()), {}
        for state in states:
            _free(state.last)
            _free(state.spare)


def _free(sample: Any) -> None:
    try:
        pynvml.nvmlGpmSampleFree(sample)
    except NVMLError:
        pass  # nothing more to do about a sample NVML will not take back


def _metrics(first: Any, second: Any) -> dict[str, float | None]:
    """Every metric of METRICS between two samples, in one call: percent, or None if unsupported."""
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(METRICS)
    request.sample1, request.sample2 = first, second
    for i, metric in enumerate(METRICS):
        request.metrics[i].metricId = metric
    pynvml.nvmlGpmMetricsGet(request)
    return {field: _value(request.metrics[i]) for i, field in enumerate(METRICS.values())}


def _value(result: Any) -> float | None:
    if result.nvmlReturn in UNSUPPORTED_CODES:
        return None
    if result.nvmlReturn != pynvml.NVML_SUCCESS:
        raise NVMLError(result.nvmlReturn)
    value = float(result.value)
    if not math.isfinite(value):
        return None  # the wire refuses NaN; no reading is the honest answer
    # Clamped: the wire fields are 0..100 and a sampling-window edge can overshoot a hair.
    return max(0.0, min(100.0, value))
