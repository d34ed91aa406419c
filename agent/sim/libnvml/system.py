"""Init and shutdown, the driver's versions, finding devices and who they are."""

from __future__ import annotations

from ctypes import POINTER, c_char_p, c_int, c_uint, c_void_p
from typing import Any

import pynvml as N

from agent.sim.libnvml.abi import DEV, Exports, NvmlReturn, error_string_address, put, put_handle, put_str, require
from agent.sim.libnvml.driver import Driver

EXPORTS = Exports()

_SUBSYSTEM_ID = 0x16C110DE  # realdata H100 board; the same for all models is fine here


# --- init / system ----------------------------------------------------------------------


def _init(driver: Driver) -> None:
    node = driver.node()
    with driver.lock:
        driver.inits[node] = driver.inits.get(node, 0) + 1


@EXPORTS.c(c_uint)
def _nvmlInitWithFlags(driver: Driver, flags: int) -> None:
    _init(driver)


@EXPORTS.c()
def _nvmlInit_v2(driver: Driver) -> None:
    _init(driver)


@EXPORTS.c()
def _nvmlShutdown(driver: Driver) -> None:
    # Refcounted per node, like one process per node: the last shutdown uninitializes it.
    node = driver.node()
    with driver.lock:
        if driver.inits.get(node, 0) <= 0:
            raise NvmlReturn(N.NVML_ERROR_UNINITIALIZED)
        driver.inits[node] -= 1


@EXPORTS.c(c_int, restype=c_void_p)
def _nvmlErrorString(driver: Driver, code: int) -> int:
    return error_string_address(code)


@EXPORTS.c(c_void_p, c_uint)
def _nvmlSystemGetDriverVersion(driver: Driver, buf: int, size: int) -> None:
    put_str(buf, size, driver.initialized_node().driver_version)


@EXPORTS.c(c_void_p, c_uint)
def _nvmlSystemGetNVMLVersion(driver: Driver, buf: int, size: int) -> None:
    node = driver.initialized_node()
    put_str(buf, size, f"{node.cuda_version // 1000}.{node.driver_version}")


@EXPORTS.c(POINTER(c_int))
def _nvmlSystemGetCudaDriverVersion(driver: Driver, out: Any) -> None:
    put(out, driver.initialized_node().cuda_version)


@EXPORTS.c(POINTER(c_int))
def _nvmlSystemGetCudaDriverVersion_v2(driver: Driver, out: Any) -> None:
    put(out, driver.initialized_node().cuda_version)


# --- enumeration ------------------------------------------------------------------------


@EXPORTS.c(POINTER(c_uint))
def _nvmlDeviceGetCount_v2(driver: Driver, out: Any) -> None:
    put(out, len(driver.initialized_node().gpus))


@EXPORTS.c(c_uint, POINTER(N.c_nvmlDevice_t))
def _nvmlDeviceGetHandleByIndex_v2(driver: Driver, index: int, out: Any) -> None:
    gpus = driver.initialized_node().gpus
    if index >= len(gpus):
        raise NvmlReturn(N.NVML_ERROR_INVALID_ARGUMENT)
    put_handle(out, driver.check(gpus[index]).handle)


@EXPORTS.c(c_char_p, POINTER(N.c_nvmlDevice_t))
def _nvmlDeviceGetHandleByUUID(driver: Driver, uuid: bytes | None, out: Any) -> None:
    if not uuid:
        raise NvmlReturn(N.NVML_ERROR_INVALID_ARGUMENT)
    for gpu in driver.initialized_node().gpus:
        if gpu.uuid == uuid.decode():
            put_handle(out, driver.check(gpu).handle)
            return
    raise NvmlReturn(N.NVML_ERROR_NOT_FOUND)


@EXPORTS.c(DEV, POINTER(c_uint))
def _nvmlDeviceGetIndex(driver: Driver, handle: int, out: Any) -> None:
    put(out, driver.device(handle).index)


# --- identity ---------------------------------------------------------------------------


@EXPORTS.c(DEV, c_void_p, c_uint)
def _nvmlDeviceGetUUID(driver: Driver, handle: int, buf: int, size: int) -> None:
    put_str(buf, size, driver.device(handle).uuid)


@EXPORTS.c(DEV, c_void_p, c_uint)
def _nvmlDeviceGetName(driver: Driver, handle: int, buf: int, size: int) -> None:
    put_str(buf, size, driver.device(handle).model.name)


@EXPORTS.c(DEV, POINTER(N.nvmlPciInfo_t))
def _nvmlDeviceGetPciInfo_v3(driver: Driver, handle: int, out: Any) -> None:
    gpu = driver.device(handle)
    info = require(out)
    domain, bus, rest = gpu.pci_bus_id.split(":")
    info.busId = gpu.pci_bus_id.encode()
    info.busIdLegacy = f"{int(domain, 16):04x}:{bus}:{rest}".encode()  # legacy 16-byte form
    info.domain = int(domain, 16)
    info.bus = int(bus, 16)
    info.device = int(rest.split(".")[0], 16)
    info.pciDeviceId = gpu.model.pci_device_id
    info.pciSubSystemId = _SUBSYSTEM_ID
