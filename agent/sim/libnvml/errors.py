"""What goes wrong with a GPU: ECC error counts, row remapping, and XID events through event sets."""

from __future__ import annotations

import ctypes
import threading
from collections import deque
from ctypes import POINTER, c_uint, c_ulonglong, c_void_p
from typing import Any

import pynvml as N

from agent.sim.gpu import SimGpu
from agent.sim.libnvml.abi import DEV, EVENT_SET, UINT_MAX, Exports, NvmlReturn, put, require
from agent.sim.libnvml.driver import Driver

EXPORTS = Exports()


# --- ECC and row remapping -----------------------------------------------------------------


@EXPORTS.c(DEV, N._nvmlMemoryErrorType_t, N._nvmlEccCounterType_t, POINTER(c_ulonglong))
def _nvmlDeviceGetTotalEccErrors(driver: Driver, handle: int, error_type: int, counter_type: int, out: Any) -> None:
    gpu = driver.device(handle)
    if not gpu.model.ecc:
        raise NvmlReturn(N.NVML_ERROR_NOT_SUPPORTED)
    if counter_type not in (N.NVML_VOLATILE_ECC, N.NVML_AGGREGATE_ECC):
        raise NvmlReturn(N.NVML_ERROR_INVALID_ARGUMENT)
    # The simulated driver was loaded when the node started: volatile == aggregate.
    if error_type == N.NVML_MEMORY_ERROR_TYPE_CORRECTED:
        put(out, int(gpu.counters.ecc_corrected))
    elif error_type == N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
        put(out, int(gpu.counters.ecc_uncorrected))
    else:
        raise NvmlReturn(N.NVML_ERROR_INVALID_ARGUMENT)


@EXPORTS.c(DEV, POINTER(c_uint), POINTER(c_uint), POINTER(c_uint), POINTER(c_uint))
def _nvmlDeviceGetRemappedRows(driver: Driver, handle: int, corr: Any, unc: Any, pending: Any, failure: Any) -> None:
    gpu = driver.device(handle)
    if not gpu.model.row_remapping:
        raise NvmlReturn(N.NVML_ERROR_NOT_SUPPORTED)
    put(corr, gpu.counters.remap_correctable)
    put(unc, gpu.counters.remap_uncorrectable)
    put(pending, int(gpu.remap_pending))
    put(failure, int(gpu.remap_failure))


# --- XID events ---------------------------------------------------------------------------

_SUPPORTED_EVENTS = N.nvmlEventTypeXidCriticalError


class _EventSet:
    def __init__(self, address: int) -> None:
        self.address = address
        self.cond = threading.Condition()
        self.queue: deque[tuple[int, int]] = deque()  # (device handle, xid)
        self.gpus: set[SimGpu] = set()  # by GPU, not handle: a handle can change on recovery

    def on_xid(self, gpu: SimGpu, xid: int) -> None:
        with self.cond:
            self.queue.append((gpu.handle, xid))
            self.cond.notify_all()


@EXPORTS.c(DEV, POINTER(c_ulonglong))
def _nvmlDeviceGetSupportedEventTypes(driver: Driver, handle: int, out: Any) -> None:
    driver.device(handle)
    put(out, _SUPPORTED_EVENTS)


@EXPORTS.c(POINTER(N.c_nvmlEventSet_t))
def _nvmlEventSetCreate(driver: Driver, out: Any) -> None:
    driver.initialized_node()
    with driver.lock:
        es = driver.event_sets.new(_EventSet)
    put(out, ctypes.cast(c_void_p(es.address), N.c_nvmlEventSet_t))


@EXPORTS.c(DEV, c_ulonglong, EVENT_SET)
def _nvmlDeviceRegisterEvents(driver: Driver, handle: int, event_types: int, set_address: int) -> None:
    gpu = driver.device(handle)
    es = driver.event_sets.get(set_address)
    if event_types & ~_SUPPORTED_EVENTS:
        raise NvmlReturn(N.NVML_ERROR_NOT_SUPPORTED)
    with driver.lock:
        if gpu not in es.gpus:
            es.gpus.add(gpu)
            gpu.add_xid_listener(es.on_xid)


@EXPORTS.c(EVENT_SET, POINTER(N.c_nvmlEventData_t), c_uint)
def _nvmlEventSetWait_v2(driver: Driver, set_address: int, out: Any, timeout_ms: int) -> None:
    es = driver.event_sets.get(set_address)
    data = require(out)
    with es.cond:
        if not es.queue and timeout_ms:
            es.cond.wait(timeout_ms / 1000.0)
        if not es.queue:
            raise NvmlReturn(N.NVML_ERROR_TIMEOUT)
        handle, xid = es.queue.popleft()
    data.device = ctypes.cast(c_void_p(handle), N.c_nvmlDevice_t)
    data.eventType = N.nvmlEventTypeXidCriticalError
    data.eventData = xid
    data.gpuInstanceId = data.computeInstanceId = UINT_MAX  # no MIG


@EXPORTS.c(EVENT_SET)
def _nvmlEventSetFree(driver: Driver, set_address: int) -> None:
    with driver.lock:
        es = driver.event_sets.free(set_address)
        for gpu in es.gpus:
            gpu.remove_xid_listener(es.on_xid)

