"""PCIe and NVLink: link generation, width and state, replays, throughput.

NVLink's counters and throughput come through field values (fields.py), as on a real driver.
"""

from __future__ import annotations

from ctypes import POINTER, c_uint
from typing import Any

import pynvml as N

from agent.sim.libnvml.abi import DEV, KIB, UINT_MAX, Exports, NvmlReturn, put
from agent.sim.libnvml.driver import Driver

EXPORTS = Exports()


# --- PCIe ---------------------------------------------------------------------------------


@EXPORTS.c(DEV, POINTER(c_uint))
def _nvmlDeviceGetCurrPcieLinkGeneration(driver: Driver, handle: int, out: Any) -> None:
    put(out, driver.device(handle).state.pcie_gen)


@EXPORTS.c(DEV, POINTER(c_uint))
def _nvmlDeviceGetMaxPcieLinkGeneration(driver: Driver, handle: int, out: Any) -> None:
    put(out, driver.device(handle).model.pcie_gen_max)


@EXPORTS.c(DEV, POINTER(c_uint))
def _nvmlDeviceGetCurrPcieLinkWidth(driver: Driver, handle: int, out: Any) -> None:
    put(out, driver.device(handle).state.pcie_width)


@EXPORTS.c(DEV, POINTER(c_uint))
def _nvmlDeviceGetMaxPcieLinkWidth(driver: Driver, handle: int, out: Any) -> None:
    put(out, driver.device(handle).model.pcie_width_max)


@EXPORTS.c(DEV, POINTER(c_uint))
def _nvmlDeviceGetPcieReplayCounter(driver: Driver, handle: int, out: Any) -> None:
    put(out, int(driver.device(handle).counters.pcie_replays) & UINT_MAX)


@EXPORTS.c(DEV, N._nvmlPcieUtilCounter_t, POINTER(c_uint))
def _nvmlDeviceGetPcieThroughput(driver: Driver, handle: int, counter: int, out: Any) -> None:
    s = driver.device(handle).state
    if counter == N.NVML_PCIE_UTIL_TX_BYTES:
        put(out, int(s.pcie_tx_bps / KIB))
    elif counter == N.NVML_PCIE_UTIL_RX_BYTES:
        put(out, int(s.pcie_rx_bps / KIB))
    else:
        raise NvmlReturn(N.NVML_ERROR_INVALID_ARGUMENT)


# --- NVLink -------------------------------------------------------------------------------


@EXPORTS.c(DEV, c_uint, POINTER(N._nvmlEnableState_t))
def _nvmlDeviceGetNvLinkState(driver: Driver, handle: int, link: int, out: Any) -> None:
    gpu = driver.device(handle)
    if gpu.model.nvlink_links == 0:
        raise NvmlReturn(N.NVML_ERROR_NOT_SUPPORTED)
    if link >= gpu.model.nvlink_links:
        raise NvmlReturn(N.NVML_ERROR_INVALID_ARGUMENT)
    put(out, N.NVML_FEATURE_ENABLED if gpu.state.links_up[link] else N.NVML_FEATURE_DISABLED)

