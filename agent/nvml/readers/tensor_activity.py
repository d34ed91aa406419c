"""Tensor-pipe activity through GPM (GPU Performance Monitoring, Hopper and newer).

GPM computes a metric from two samples taken at different times, so this reader keeps state
between sampling cycles: per GPU, the sample of the previous cycle and a spare buffer. Each
cycle takes one nvmlGpmSampleGet into the spare and asks for NVML_GPM_METRIC_ANY_TENSOR_UTIL
between the previous sample and it: the activity averaged over the whole sampling interval.
The first cycle (and the first after a GPU came back with a new handle) has nothing to
compare with and leaves the field None. A GPU without GPM is asked once and then skipped.

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

METRIC = pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL


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
        gpu.tensor_active_pct = _tensor_util(state.spare, state.last)

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


def _tensor_util(first: Any, second: Any) -> float | None:
    """NVML_GPM_METRIC_ANY_TENSOR_UTIL between two samples: percent, or None if unsupported."""
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = 1
    request.sample1, request.sample2 = first, second
    request.metrics[0].metricId = METRIC
    pynvml.nvmlGpmMetricsGet(request)
    result = request.metrics[0]
    if result.nvmlReturn in UNSUPPORTED_CODES:
        return None
    if result.nvmlReturn != pynvml.NVML_SUCCESS:
        raise NVMLError(result.nvmlReturn)
    value = float(result.value)
    if not math.isfinite(value):
        return None  # the wire refuses NaN; no reading is the honest answer
    # Clamped: the wire field is 0..100 and a sampling-window edge can overshoot a hair.
    return max(0.0, min(100.0, value))
