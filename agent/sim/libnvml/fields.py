"""nvmlDeviceGetFieldValues: one call, each entry answered on its own (the call itself succeeds).

The simulated fields: HBM temperature, the PCIe replay counter, and NVLink's link count,
error totals and throughput (total, or per link).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from ctypes import c_int32, c_void_p

import pynvml as N

from agent.nvml.session import FieldValueView
from agent.sim.gpu import SimGpu
from agent.sim.libnvml.abi import DEV, KIB, UINT_MAX, Exports, NvmlReturn
from agent.sim.libnvml.driver import Driver

EXPORTS = Exports()

_UINT, _ULL = N.NVML_VALUE_TYPE_UNSIGNED_INT, N.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
FieldValue = tuple[int, str, int]  # valueType, the member of the value union, the value
FieldReader = Callable[[SimGpu, int], FieldValue]  # (gpu, scopeId)


def _memory_temp(gpu: SimGpu, scope: int) -> FieldValue:
    if gpu.state.mem_temp_c is None:
        raise NvmlReturn(N.NVML_ERROR_NOT_SUPPORTED)
    return _UINT, "uiVal", round(gpu.state.mem_temp_c)


def _pcie_replays(gpu: SimGpu, scope: int) -> FieldValue:
    return _ULL, "ullVal", int(gpu.counters.pcie_replays)


def _nvlink(read: FieldReader) -> FieldReader:
    def field(gpu: SimGpu, scope: int) -> FieldValue:
        if gpu.model.nvlink_links == 0:
            raise NvmlReturn(N.NVML_ERROR_NOT_SUPPORTED)
        return read(gpu, scope)

    return field


def _link_count(gpu: SimGpu, scope: int) -> FieldValue:
    return _UINT, "uiVal", gpu.model.nvlink_links


def _error_total(counter: str) -> FieldReader:
    return lambda gpu, scope: (_ULL, "ullVal", int(getattr(gpu.counters, counter)))


def _throughput(counter: str, overhead: float) -> FieldReader:
    """KiB through the links: `overhead` > 1 counts the protocol's own bytes too (the RAW fields)."""

    def read(gpu: SimGpu, scope: int) -> FieldValue:
        kib = getattr(gpu.counters, counter) * overhead / KIB
        if scope == UINT_MAX:
            return _ULL, "ullVal", int(kib)
        if scope >= gpu.model.nvlink_links:
            raise NvmlReturn(N.NVML_ERROR_INVALID_ARGUMENT)
        # Per link: an even share over the links that are up now (an approximation).
        up = gpu.state.links_active
        return _ULL, "ullVal", int(kib / up) if up and gpu.state.links_up[scope] else 0

    return read


FIELDS: dict[int, FieldReader] = {
    N.NVML_FI_DEV_MEMORY_TEMP: _memory_temp,
    N.NVML_FI_DEV_PCIE_REPLAY_COUNTER: _pcie_replays,
    N.NVML_FI_DEV_NVLINK_LINK_COUNT: _nvlink(_link_count),
    N.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: _nvlink(_error_total("nvlink_crc_flit")),
    N.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: _nvlink(_error_total("nvlink_crc_data")),
    N.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: _nvlink(_error_total("nvlink_replay")),
    N.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: _nvlink(_error_total("nvlink_recovery")),
    N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: _nvlink(_throughput("nvlink_tx_bytes", 1.0)),
    N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: _nvlink(_throughput("nvlink_rx_bytes", 1.0)),
    N.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX: _nvlink(_throughput("nvlink_tx_bytes", 1.06)),
    N.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX: _nvlink(_throughput("nvlink_rx_bytes", 1.06)),
}


def _unsupported(gpu: SimGpu, scope: int) -> FieldValue:
    raise NvmlReturn(N.NVML_ERROR_NOT_SUPPORTED)


@EXPORTS.c(DEV, c_int32, c_void_p)
def _nvmlDeviceGetFieldValues(driver: Driver, handle: int, count: int, values_address: int) -> None:
    gpu = driver.device(handle)
    if count < 0 or (count and not values_address):
        raise NvmlReturn(N.NVML_ERROR_INVALID_ARGUMENT)
    # The plain view: pynvml's struct class hooks every attribute access (see FieldValueView).
    values = (FieldValueView * count).from_address(values_address) if count else []
    now_us = int(time.time() * 1e6)
    for fv in values:
        fv.timestamp, fv.latencyUsec = now_us, 0
        try:
            fv.valueType, member, value = FIELDS.get(fv.fieldId, _unsupported)(gpu, fv.scopeId)
            setattr(fv.value, member, value)
            fv.nvmlReturn = N.NVML_SUCCESS
        except NvmlReturn as r:
            fv.nvmlReturn = r.code
