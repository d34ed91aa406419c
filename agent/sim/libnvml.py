"""A fake libnvidia-ml.so: ctypes function pointers over simulated nodes.

pynvml resolves every C function with getattr(pynvml.nvmlLib, name). `SimNvmlLib` answers
that with real ctypes function pointers (CFUNCTYPE, C signatures of nvml.h: nvmlReturn_t
result, outputs written through the pointer arguments), so pynvml's own marshalling, struct
decoding and error-code -> exception mapping run unchanged on top of it.

- The running-process lists answer each SimGpu's `processes` (agent/sim/processes.py).
- A function not implemented here is absent, so pynvml raises FUNCTION_NOT_FOUND exactly as
  with an older driver; `omit=` removes implemented ones to mimic such a driver.
- A function the simulated GPU model lacks answers NVML_ERROR_NOT_SUPPORTED.
- One library serves many nodes at once: device handles are unique per SimGpu, and the
  per-node calls (init/shutdown, count, handle lookup, system versions) resolve through a
  thread-local current node: `with lib.node(sim_node): ...`.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from ctypes import CFUNCTYPE, POINTER, c_char_p, c_int, c_int32, c_uint, c_ulonglong, c_void_p
from typing import Any

import pynvml as N

from agent.nvml.session import FieldValueView
from agent.sim.gpu import SimGpu, SimNode, gpu_by_handle
from agent.sim.processes import PROCESS_LISTS, VERSIONS, answer_processes

log = logging.getLogger(__name__)

# What a driver before 535 lacks among the functions the agent uses.
PRE_535_DRIVER = frozenset({"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetTemperatureV"})

# nvmlDevice_t / nvmlEventSet_t are opaque pointers: the callbacks see their integer values.
_DEV = c_void_p
_SET = c_void_p
_UINT_MAX = 0xFFFFFFFF
_KIB = 1024
_SUBSYSTEM_ID = 0x16C110DE  # realdata H100 board; the same for all models is fine here
_VIDEO_CLOCK_RATIO = 1545 / 1980  # H100 max video/SM clock

_API: dict[str, tuple[Any, tuple[Any, ...], Callable[..., Any]]] = {}


def _export(*argtypes: Any, restype: Any = c_int) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register `_nvmlX(lib, *args)` as C function nvmlX(args) with these argument types."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        _API[fn.__name__[1:]] = (restype, argtypes, fn)
        return fn

    return register


class _Return(Exception):
    """Return early from a simulated call with this nvmlReturn_t."""

    def __init__(self, code: int) -> None:
        self.code = code


def _put(ptr: Any, value: Any) -> None:
    if not ptr:
        raise _Return(N.NVML_ERROR_INVALID_ARGUMENT)
    ptr[0] = value


def _put_str(address: int | None, size: int, text: str) -> None:
    if not address:
        raise _Return(N.NVML_ERROR_INVALID_ARGUMENT)
    data = text.encode() + b"\0"
    if len(data) > size:
        raise _Return(N.NVML_ERROR_INSUFFICIENT_SIZE)
    ctypes.memmove(address, data, len(data))


def _put_handle(ptr: Any, handle: int) -> None:
    _put(ptr, ctypes.cast(c_void_p(handle), N.c_nvmlDevice_t))


_ERROR_STRINGS: dict[int, ctypes.Array] = {}


def _error_string_address(code: int) -> int:
    # nvmlErrorString returns const char*; keep one buffer per code alive for good.
    buf = _ERROR_STRINGS.get(code)
    if buf is None:
        text = N.NVMLError._errcode_to_string.get(code, "Unknown Error")
        buf = _ERROR_STRINGS.setdefault(code, ctypes.create_string_buffer(text.encode()))
    return ctypes.addressof(buf)


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


class _GpmSample:
    """What nvmlGpmSampleGet snapshots: the sim clock and the activity counters (seconds)."""

    def __init__(self, address: int) -> None:
        self.address = address
        self.gpu: SimGpu | None = None  # None until filled by nvmlGpmSampleGet
        self.ts = 0.0
        self.tensor_active_s = 0.0
        self.gr_active_s = 0.0
        self.dram_active_s = 0.0


class SimNvmlLib:
    def __init__(self, default_node: SimNode | None = None, *, omit: Iterable[str] = ()) -> None:
        omit = frozenset(omit)
        if omit - set(_API):
            raise ValueError(f"cannot omit unknown functions: {sorted(omit - set(_API))}")
        self._lock = threading.RLock()
        self._local = threading.local()
        self._inits: dict[SimNode, int] = {}
        self._event_sets: dict[int, _EventSet] = {}
        self._set_addresses = itertools.count(0x7F000000, 0x100)
        self._gpm_samples: dict[int, _GpmSample] = {}
        self._gpm_addresses = itertools.count(0x7E000000, 0x100)
        # handle -> GPU, in front of gpu_by_handle (a WeakValueDictionary, slow per call);
        # an entry whose GPU has had a new handle since is dropped on its next use.
        self._gpus: dict[int, SimGpu] = {}
        self.default_node = default_node
        funcs = {}
        for name, (restype, argtypes, impl) in _API.items():
            if name not in omit:
                funcs[name] = CFUNCTYPE(restype, *argtypes)(self._guard(name, impl, restype))
        self._funcs = funcs  # set last: __getattr__ relies on it

    def __getattr__(self, name: str) -> Any:
        funcs = self.__dict__.get("_funcs")
        if funcs is not None and name in funcs:
            return funcs[name]
        raise AttributeError(name)

    @property
    def functions(self) -> frozenset[str]:
        return frozenset(self._funcs)

    # -- nodes -------------------------------------------------------------------------
    @contextlib.contextmanager
    def node(self, sim_node: SimNode, *, at: float | None = None) -> Iterator[SimNode]:
        """Make `sim_node` this thread's node for per-node calls; optionally advance it to `at` first."""
        stack = self._local.__dict__.setdefault("stack", [])
        stack.append(sim_node)
        try:
            if at is not None:
                sim_node.advance(at)
            yield sim_node
        finally:
            stack.pop()

    @property
    def current_node(self) -> SimNode | None:
        stack = getattr(self._local, "stack", None)
        return stack[-1] if stack else self.default_node

    def init_count(self, node: SimNode) -> int:
        return self._inits.get(node, 0)

    # -- plumbing ----------------------------------------------------------------------
    def _guard(self, name: str, impl: Callable[..., Any], restype: Any) -> Callable[..., Any]:
        # An exception escaping a ctypes callback would be printed and read as 0 = SUCCESS.
        if restype is not c_int:

            def raw(*args: Any) -> Any:
                try:
                    return impl(self, *args)
                except Exception:
                    log.exception("simulated %s failed", name)
                    return _error_string_address(N.NVML_ERROR_UNKNOWN)

            return raw

        def call(*args: Any) -> int:
            self._local.fn = name
            try:
                ret = impl(self, *args)
                return N.NVML_SUCCESS if ret is None else ret
            except _Return as r:
                return r.code
            except Exception:
                log.exception("simulated %s failed", name)
                return N.NVML_ERROR_UNKNOWN

        return call

    def _node(self) -> SimNode:
        node = self.current_node
        if node is None:
            raise _Return(N.NVML_ERROR_DRIVER_NOT_LOADED)  # like a machine without the driver
        return node

    def _initialized_node(self) -> SimNode:
        node = self._node()
        if self._inits.get(node, 0) <= 0:
            raise _Return(N.NVML_ERROR_UNINITIALIZED)
        return node

    def _check(self, gpu: SimGpu) -> SimGpu:
        if self._inits.get(gpu.node, 0) <= 0:
            raise _Return(N.NVML_ERROR_UNINITIALIZED)
        if gpu.lost:
            raise _Return(N.NVML_ERROR_GPU_IS_LOST)
        if gpu.call_errors:
            code = gpu.call_errors.get(self._local.fn)
            if code:
                raise _Return(code)
        return gpu

    def _device(self, handle: int | None) -> SimGpu:
        gpu = self._gpus.get(handle)
        if gpu is None or gpu.handle != handle:
            self._gpus.pop(handle, None)
            gpu = gpu_by_handle(handle)
            if gpu is None:
                raise _Return(N.NVML_ERROR_INVALID_ARGUMENT)
            self._gpus[handle] = gpu
        return self._check(gpu)

    def _gpm_sample(self, address: int | None) -> _GpmSample:
        sample = self._gpm_samples.get(address or 0)
        if sample is None:
            raise _Return(N.NVML_ERROR_INVALID_ARGUMENT)
        return sample

    @property
    def gpm_samples_allocated(self) -> int:
        """GPM samples allocated and not freed yet (a leak check for tests)."""
        return len(self._gpm_samples)

    def _event_set(self, address: int | None) -> _EventSet:
        es = self._event_sets.get(address or 0)
        if es is None:
            raise _Return(N.NVML_ERROR_INVALID_ARGUMENT)
        return es

    # -- simulated field values ----------------------------------------------------------
    def _field(self, gpu: SimGpu, field_id: int, scope: int) -> tuple[int, str, int]:
        m, s, c = gpu.model, gpu.state, gpu.counters
        ull = N.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
        if field_id == N.NVML_FI_DEV_MEMORY_TEMP:
            if s.mem_temp_c is None:
                raise _Return(N.NVML_ERROR_NOT_SUPPORTED)
            return N.NVML_VALUE_TYPE_UNSIGNED_INT, "uiVal", round(s.mem_temp_c)
        if field_id == N.NVML_FI_DEV_PCIE_REPLAY_COUNTER:
            return ull, "ullVal", int(c.pcie_replays)
        nvlink = {
            N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: lambda: c.nvlink_tx_bytes / _KIB,
            N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: lambda: c.nvlink_rx_bytes / _KIB,
            N.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX: lambda: c.nvlink_tx_bytes * 1.06 / _KIB,
            N.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX: lambda: c.nvlink_rx_bytes * 1.06 / _KIB,
        }
        totals = {
            N.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: c.nvlink_crc_flit,
            N.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: c.nvlink_crc_data,
            N.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: c.nvlink_replay,
            N.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: c.nvlink_recovery,
        }
        if field_id in nvlink or field_id in totals or field_id == N.NVML_FI_DEV_NVLINK_LINK_COUNT:
            if m.nvlink_links == 0:
                raise _Return(N.NVML_ERROR_NOT_SUPPORTED)
            if field_id == N.NVML_FI_DEV_NVLINK_LINK_COUNT:
                return N.NVML_VALUE_TYPE_UNSIGNED_INT, "uiVal", m.nvlink_links
            if field_id in totals:
                return ull, "ullVal", int(totals[field_id])
            kib = nvlink[field_id]()
            if scope == _UINT_MAX:
                return ull, "ullVal", int(kib)
            if scope >= m.nvlink_links:
                raise _Return(N.NVML_ERROR_INVALID_ARGUMENT)
            # Per link: an even share over the links that are up now (an approximation).
            up = s.links_active
            return ull, "ullVal", int(kib / up) if up and s.links_up[scope] else 0
        raise _Return(N.NVML_ERROR_NOT_SUPPORTED)


# --- init / system ----------------------------------------------------------------------


def _init(lib: SimNvmlLib) -> None:
    node = lib._node()
    with lib._lock:
        lib._inits[node] = lib._inits.get(node, 0) + 1


@_export(c_uint)
def _nvmlInitWithFlags(lib: SimNvmlLib, flags: int) -> None:
    _init(lib)


@_export()
def _nvmlInit_v2(lib: SimNvmlLib) -> None:
    _init(lib)


@_export()
def _nvmlShutdown(lib: SimNvmlLib) -> None:
    # Refcounted per node, like one process per node: the last shutdown uninitializes it.
    node = lib._node()
    with lib._lock:
        if lib._inits.get(node, 0) <= 0:
            raise _Return(N.NVML_ERROR_UNINITIALIZED)
        lib._inits[node] -= 1


@_export(c_int, restype=c_void_p)
def _nvmlErrorString(lib: SimNvmlLib, code: int) -> int:
    return _error_string_address(code)


@_export(c_void_p, c_uint)
def _nvmlSystemGetDriverVersion(lib: SimNvmlLib, buf: int, size: int) -> None:
    _put_str(buf, size, lib._initialized_node().driver_version)


@_export(c_void_p, c_uint)
def _nvmlSystemGetNVMLVersion(lib: SimNvmlLib, buf: int, size: int) -> None:
    node = lib._initialized_node()
    _put_str(buf, size, f"{node.cuda_version // 1000}.{node.driver_version}")


@_export(POINTER(c_int))
def _nvmlSystemGetCudaDriverVersion(lib: SimNvmlLib, out: Any) -> None:
    _put(out, lib._initialized_node().cuda_version)


@_export(POINTER(c_int))
def _nvmlSystemGetCudaDriverVersion_v2(lib: SimNvmlLib, out: Any) -> None:
    _put(out, lib._initialized_node().cuda_version)


# --- enumeration ------------------------------------------------------------------------


@_export(POINTER(c_uint))
def _nvmlDeviceGetCount_v2(lib: SimNvmlLib, out: Any) -> None:
    _put(out, len(lib._initialized_node().gpus))


@_export(c_uint, POINTER(N.c_nvmlDevice_t))
def _nvmlDeviceGetHandleByIndex_v2(lib: SimNvmlLib, index: int, out: Any) -> None:
    gpus = lib._initialized_node().gpus
    if index >= len(gpus):
        raise _Return(N.NVML_ERROR_INVALID_ARGUMENT)
    _put_handle(out, lib._check(gpus[index]).handle)


@_export(c_char_p, POINTER(N.c_nvmlDevice_t))
def _nvmlDeviceGetHandleByUUID(lib: SimNvmlLib, uuid: bytes | None, out: Any) -> None:
    if not uuid:
        raise _Return(N.NVML_ERROR_INVALID_ARGUMENT)
    for gpu in lib._initialized_node().gpus:
        if gpu.uuid == uuid.decode():
            _put_handle(out, lib._check(gpu).handle)
            return
    raise _Return(N.NVML_ERROR_NOT_FOUND)


@_export(_DEV, POINTER(c_uint))
def _nvmlDeviceGetIndex(lib: SimNvmlLib, handle: int, out: Any) -> None:
    _put(out, lib._device(handle).index)


# --- identity ---------------------------------------------------------------------------


@_export(_DEV, c_void_p, c_uint)
def _nvmlDeviceGetUUID(lib: SimNvmlLib, handle: int, buf: int, size: int) -> None:
    _put_str(buf, size, lib._device(handle).uuid)


@_export(_DEV, c_void_p, c_uint)
def _nvmlDeviceGetName(lib: SimNvmlLib, handle: int, buf: int, size: int) -> None:
    _put_str(buf, size, lib._device(handle).model.name)


@_export(_DEV, POINTER(N.nvmlPciInfo_t))
def _nvmlDeviceGetPciInfo_v3(lib: SimNvmlLib, handle: int, out: Any) -> None:
    gpu = lib._device(handle)
    if not out:
        raise _Return(N.NVML_ERROR_INVALID_ARGUMENT)
    info = out.contents
    domain, bus, rest = gpu.pci_bus_id.split(":")
    info.busId = gpu.pci_bus_id.encode()
    info.busIdLegacy = f"{int(domain, 16):04x}:{bus}:{rest}".encode()  # legacy 16-byte form
    info.domain = int(domain, 16)
    info.bus = int(bus, 16)
    info.device = int(rest.split(".")[0], 16)
    info.pciDeviceId = gpu.model.pci_device_id
    info.pciSubSystemId = _SUBSYSTEM_ID


# --- thermals, power, clocks, utilization, memory ---------------------------------------


@_export(_DEV, N._nvmlTemperatureSensors_t, POINTER(c_uint))
def _nvmlDeviceGetTemperature(lib: SimNvmlLib, handle: int, sensor: int, out: Any) -> None:
    gpu = lib._device(handle)
    if sensor != N.NVML_TEMPERATURE_GPU:
        raise _Return(N.NVML_ERROR_NOT_SUPPORTED)
    _put(out, round(gpu.state.temp_c))


@_export(_DEV, POINTER(N.c_nvmlTemperature_v1_t))
def _nvmlDeviceGetTemperatureV(lib: SimNvmlLib, handle: int, out: Any) -> None:
    gpu = lib._device(handle)
    if not out:
        raise _Return(N.NVML_ERROR_INVALID_ARGUMENT)
    t = out.contents
    if t.version != N.nvmlTemperature_v1:
        raise _Return(N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    if t.sensorType != N.NVML_TEMPERATURE_GPU:
        raise _Return(N.NVML_ERROR_NOT_SUPPORTED)
    t.temperature = round(gpu.state.temp_c)


@_export(_DEV, c_int32, c_void_p)
def _nvmlDeviceGetFieldValues(lib: SimNvmlLib, handle: int, count: int, values_address: int) -> None:
    gpu = lib._device(handle)
    if count < 0 or (count and not values_address):
        raise _Return(N.NVML_ERROR_INVALID_ARGUMENT)
    # The plain view: pynvml's struct class hooks every attribute access (see FieldValueView).
    values = (FieldValueView * count).from_address(values_address) if count else []
    now_us = int(time.time() * 1e6)
    for fv in values:
        # Like NVML: the call succeeds, each entry carries its own result.
        fv.timestamp, fv.latencyUsec = now_us, 0
        try:
            fv.valueType, member, value = lib._field(gpu, fv.fieldId, fv.scopeId)
            setattr(fv.value, member, value)
            fv.nvmlReturn = N.NVML_SUCCESS
        except _Return as r:
            fv.nvmlReturn = r.code


@_export(_DEV, POINTER(c_uint))
def _nvmlDeviceGetPowerUsage(lib: SimNvmlLib, handle: int, out: Any) -> None:
    _put(out, round(lib._device(handle).state.power_w * 1000))


@_export(_DEV, POINTER(c_uint))
def _nvmlDeviceGetEnforcedPowerLimit(lib: SimNvmlLib, handle: int, out: Any) -> None:
    _put(out, round(lib._device(handle).state.power_limit_w * 1000))


@_export(_DEV, POINTER(c_ulonglong))
def _nvmlDeviceGetTotalEnergyConsumption(lib: SimNvmlLib, handle: int, out: Any) -> None:
    # mJ since the driver loaded: power integrated over the simulated clock, never decreasing.
    _put(out, int(lib._device(handle).counters.energy_mj))


def _clock(gpu: SimGpu, clock_type: int, current: bool) -> int:
    m, s = gpu.model, gpu.state
    sm = int(s.sm_clock_mhz) if current else m.sm_clock_max_mhz
    if clock_type in (N.NVML_CLOCK_SM, N.NVML_CLOCK_GRAPHICS):
        return sm
    if clock_type == N.NVML_CLOCK_MEM:
        return s.mem_clock_mhz if current else m.mem_clock_max_mhz
    if clock_type == N.NVML_CLOCK_VIDEO:
        return round(sm * _VIDEO_CLOCK_RATIO)
    raise _Return(N.NVML_ERROR_INVALID_ARGUMENT)


@_export(_DEV, N._nvmlClockType_t, POINTER(c_uint))
def _nvmlDeviceGetClockInfo(lib: SimNvmlLib, handle: int, clock_type: int, out: Any) -> None:
    _put(out, _clock(lib._device(handle), clock_type, current=True))


@_export(_DEV, N._nvmlClockType_t, POINTER(c_uint))
def _nvmlDeviceGetMaxClockInfo(lib: SimNvmlLib, handle: int, clock_type: int, out: Any) -> None:
    _put(out, _clock(lib._device(handle), clock_type, current=False))


@_export(_DEV, POINTER(N.c_nvmlUtilization_t))
def _nvmlDeviceGetUtilizationRates(lib: SimNvmlLib, handle: int, out: Any) -> None:
    gpu = lib._device(handle)
    if not out:
        raise _Return(N.NVML_ERROR_INVALID_ARGUMENT)
    out.contents.gpu = gpu.state.util_gpu
    out.contents.memory = gpu.state.util_mem


# The video engines' sampling period (µs) NVML reports along with their utilization.
_VIDEO_SAMPLING_PERIOD_US = 167_000


@_export(_DEV, POINTER(c_uint), POINTER(c_uint))
def _nvmlDeviceGetEncoderUtilization(lib: SimNvmlLib, handle: int, util: Any, period_us: Any) -> None:
    gpu = lib._device(handle)
    _put(util, int(gpu.enc_util))
    _put(period_us, _VIDEO_SAMPLING_PERIOD_US)


@_export(_DEV, POINTER(c_uint), POINTER(c_uint))
def _nvmlDeviceGetDecoderUtilization(lib: SimNvmlLib, handle: int, util: Any, period_us: Any) -> None:
    gpu = lib._device(handle)
    _put(util, int(gpu.dec_util))
    _put(period_us, _VIDEO_SAMPLING_PERIOD_US)


@_export(_DEV, POINTER(N.c_nvmlMemory_t))
def _nvmlDeviceGetMemoryInfo(lib: SimNvmlLib, handle: int, out: Any) -> None:
    # v1: "used" is allocated + reserved (the state's mem_used_bytes, the reserved part included).
    gpu = lib._device(handle)
    if not out:
        raise _Return(N.NVML_ERROR_INVALID_ARGUMENT)
    total, used = gpu.model.memory_total_bytes, gpu.state.mem_used_bytes
    out.contents.total, out.contents.used, out.contents.free = total, used, total - used


@_export(_DEV, POINTER(N.c_nvmlMemory_v2_t))
def _nvmlDeviceGetMemoryInfo_v2(lib: SimNvmlLib, handle: int, out: Any) -> None:
    # v2 splits the driver's and firmware's reservation out of "used": total = reserved + used +
    # free, as `nvidia-smi -q` shows it (realdata H100: 81559 = 551 reserved + 0 used + 81007 free, MiB).
    gpu = lib._device(handle)
    if not out:
        raise _Return(N.NVML_ERROR_INVALID_ARGUMENT)
    mem = out.contents
    if mem.version != N.nvmlMemory_v2:
        raise _Return(N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    total, used, reserved = gpu.model.memory_total_bytes, gpu.state.mem_used_bytes, gpu.model.memory_reserved_bytes
    mem.total, mem.reserved, mem.used, mem.free = total, reserved, max(0, used - reserved), total - max(used, reserved)


@_export(_DEV, POINTER(c_ulonglong))
def _nvmlDeviceGetCurrentClocksEventReasons(lib: SimNvmlLib, handle: int, out: Any) -> None:
    _put(out, lib._device(handle).state.reasons)


@_export(_DEV, POINTER(c_ulonglong))
def _nvmlDeviceGetCurrentClocksThrottleReasons(lib: SimNvmlLib, handle: int, out: Any) -> None:
    _put(out, lib._device(handle).state.reasons)


# --- PCIe ---------------------------------------------------------------------------------


@_export(_DEV, POINTER(c_uint))
def _nvmlDeviceGetCurrPcieLinkGeneration(lib: SimNvmlLib, handle: int, out: Any) -> None:
    _put(out, lib._device(handle).state.pcie_gen)


@_export(_DEV, POINTER(c_uint))
def _nvmlDeviceGetMaxPcieLinkGeneration(lib: SimNvmlLib, handle: int, out: Any) -> None:
    _put(out, lib._device(handle).model.pcie_gen_max)


@_export(_DEV, POINTER(c_uint))
def _nvmlDeviceGetCurrPcieLinkWidth(lib: SimNvmlLib, handle: int, out: Any) -> None:
    _put(out, lib._device(handle).state.pcie_width)


@_export(_DEV, POINTER(c_uint))
def _nvmlDeviceGetMaxPcieLinkWidth(lib: SimNvmlLib, handle: int, out: Any) -> None:
    _put(out, lib._device(handle).model.pcie_width_max)


@_export(_DEV, POINTER(c_uint))
def _nvmlDeviceGetPcieReplayCounter(lib: SimNvmlLib, handle: int, out: Any) -> None:
    _put(out, int(lib._device(handle).counters.pcie_replays) & _UINT_MAX)


@_export(_DEV, N._nvmlPcieUtilCounter_t, POINTER(c_uint))
def _nvmlDeviceGetPcieThroughput(lib: SimNvmlLib, handle: int, counter: int, out: Any) -> None:
    s = lib._device(handle).state
    if counter == N.NVML_PCIE_UTIL_TX_BYTES:
        _put(out, int(s.pcie_tx_bps / _KIB))
    elif counter == N.NVML_PCIE_UTIL_RX_BYTES:
        _put(out, int(s.pcie_rx_bps / _KIB))
    else:
        raise _Return(N.NVML_ERROR_INVALID_ARGUMENT)


# --- NVLink, ECC, row remapping -------------------------------------------------------------


@_export(_DEV, c_uint, POINTER(N._nvmlEnableState_t))
def _nvmlDeviceGetNvLinkState(lib: SimNvmlLib, handle: int, link: int, out: Any) -> None:
    gpu = lib._device(handle)
    if gpu.model.nvlink_links == 0:
        raise _Return(N.NVML_ERROR_NOT_SUPPORTED)
    if link >= gpu.model.nvlink_links:
        raise _Return(N.NVML_ERROR_INVALID_ARGUMENT)
    _put(out, N.NVML_FEATURE_ENABLED if gpu.state.links_up[link] else N.NVML_FEATURE_DISABLED)


@_export(_DEV, N._nvmlMemoryErrorType_t, N._nvmlEccCounterType_t, POINTER(c_ulonglong))
def _nvmlDeviceGetTotalEccErrors(lib: SimNvmlLib, handle: int, error_type: int, counter_type: int, out: Any) -> None:
    gpu = lib._device(handle)
    if not gpu.model.ecc:
        raise _Return(N.NVML_ERROR_NOT_SUPPORTED)
    if counter_type not in (N.NVML_VOLATILE_ECC, N.NVML_AGGREGATE_ECC):
        raise _Return(N.NVML_ERROR_INVALID_ARGUMENT)
    # The simulated driver was loaded when the node started: volatile == aggregate.
    if error_type == N.NVML_MEMORY_ERROR_TYPE_CORRECTED:
        _put(out, int(gpu.counters.ecc_corrected))
    elif error_type == N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
        _put(out, int(gpu.counters.ecc_uncorrected))
    else:
        raise _Return(N.NVML_ERROR_INVALID_ARGUMENT)


@_export(_DEV, POINTER(c_uint), POINTER(c_uint), POINTER(c_uint), POINTER(c_uint))
def _nvmlDeviceGetRemappedRows(lib: SimNvmlLib, handle: int, corr: Any, unc: Any, pending: Any, failure: Any) -> None:
    gpu = lib._device(handle)
    if not gpu.model.row_remapping:
        raise _Return(N.NVML_ERROR_NOT_SUPPORTED)
    _put(corr, gpu.counters.remap_correctable)
    _put(unc, gpu.counters.remap_uncorrectable)
    _put(pending, int(gpu.remap_pending))
    _put(failure, int(gpu.remap_failure))


# --- running processes ----------------------------------------------------------------------


def _process_list(kind: str) -> Callable[..., Any]:
    def impl(lib: SimNvmlLib, handle: int, count: Any, infos: int | None) -> int:
        gpu = lib._device(handle)
        if kind != "compute":  # a training node: nothing graphics, no MPS server
            return answer_processes((), count, infos)
        procs = gpu.processes
        # A process of unset memory holds its share of what the GPU has in use.
        share = gpu.state.mem_used_bytes // max(1, sum(1 for p in procs if p.used_bytes is None))
        return answer_processes([(p.pid, share if p.used_bytes is None else p.used_bytes) for p in procs], count, infos)

    return impl


for _kind, _base in PROCESS_LISTS.items():
    for _version in VERSIONS:
        _API[_base + _version] = (c_int, (_DEV, POINTER(c_uint), c_void_p), _process_list(_kind))


# --- events -------------------------------------------------------------------------------

_SUPPORTED_EVENTS = N.nvmlEventTypeXidCriticalError


@_export(_DEV, POINTER(c_ulonglong))
def _nvmlDeviceGetSupportedEventTypes(lib: SimNvmlLib, handle: int, out: Any) -> None:
    lib._device(handle)
    _put(out, _SUPPORTED_EVENTS)


@_export(POINTER(N.c_nvmlEventSet_t))
def _nvmlEventSetCreate(lib: SimNvmlLib, out: Any) -> None:
    lib._initialized_node()
    with lib._lock:
        es = _EventSet(next(lib._set_addresses))
        lib._event_sets[es.address] = es
    _put(out, ctypes.cast(c_void_p(es.address), N.c_nvmlEventSet_t))


@_export(_DEV, c_ulonglong, _SET)
def _nvmlDeviceRegisterEvents(lib: SimNvmlLib, handle: int, event_types: int, set_address: int) -> None:
    gpu = lib._device(handle)
    es = lib._event_set(set_address)
    if event_types & ~_SUPPORTED_EVENTS:
        raise _Return(N.NVML_ERROR_NOT_SUPPORTED)
    with lib._lock:
        if gpu not in es.gpus:
            es.gpus.add(gpu)
            gpu.add_xid_listener(es.on_xid)


@_export(_SET, POINTER(N.c_nvmlEventData_t), c_uint)
def _nvmlEventSetWait_v2(lib: SimNvmlLib, set_address: int, out: Any, timeout_ms: int) -> None:
    es = lib._event_set(set_address)
    if not out:
        raise _Return(N.NVML_ERROR_INVALID_ARGUMENT)
    with es.cond:
        if not es.queue and timeout_ms:
            es.cond.wait(timeout_ms / 1000.0)
        if not es.queue:
            raise _Return(N.NVML_ERROR_TIMEOUT)
        handle, xid = es.queue.popleft()
    data = out.contents
    data.device = ctypes.cast(c_void_p(handle), N.c_nvmlDevice_t)
    data.eventType = N.nvmlEventTypeXidCriticalError
    data.eventData = xid
    data.gpuInstanceId = data.computeInstanceId = _UINT_MAX  # no MIG


@_export(_SET)
def _nvmlEventSetFree(lib: SimNvmlLib, set_address: int) -> None:
    with lib._lock:
        es = lib._event_sets.pop(set_address or 0, None)
        if es is None:
            raise _Return(N.NVML_ERROR_INVALID_ARGUMENT)
        for gpu in es.gpus:
            gpu.remove_xid_listener(es.on_xid)


# --- GPM (GPU Performance Monitoring, Hopper+) -------------------------------------------------
# Metrics come from two samples: the activity counters' growth over the time between them.
# Only the metrics below are simulated; other metric ids answer NOT_SUPPORTED in their own
# entry, as NVML does per metric.

_GPM_SAMPLE = c_void_p  # nvmlGpmSample_t is an opaque pointer
# metric id -> (the _GpmSample / Counters attribute, the GpuState percent, metricInfo names and unit)
_GPM_METRICS: dict[int, tuple[str, str, tuple[bytes, bytes, bytes]]] = {
    N.NVML_GPM_METRIC_ANY_TENSOR_UTIL: ("tensor_active_s", "tensor_active_pct",
                                        (b"any_tensor_util", b"Percentage of time the SMs were doing any tensor operations", b"%")),
    N.NVML_GPM_METRIC_GRAPHICS_UTIL: ("gr_active_s", "gr_engine_active_pct",
                                      (b"graphics_util", b"Percentage of time any compute/graphics app was active on the GPU", b"%")),
    N.NVML_GPM_METRIC_DRAM_BW_UTIL: ("dram_active_s", "dram_active_pct",
                                     (b"dram_bw_util", b"Percentage of DRAM bandwidth used vs theoretical maximum", b"%")),
}


def _gpm_device(lib: SimNvmlLib, handle: int) -> SimGpu:
    gpu = lib._device(handle)
    if not gpu.model.gpm:
        raise _Return(N.NVML_ERROR_NOT_SUPPORTED)
    return gpu


@_export(_DEV, POINTER(N.c_nvmlGpmSupport_t))
def _nvmlGpmQueryDeviceSupport(lib: SimNvmlLib, handle: int, out: Any) -> None:
    # Like NVML: a GPU without GPM is a successful answer with isSupportedDevice = 0.
    gpu = lib._device(handle)
    if not out:
        raise _Return(N.NVML_ERROR_INVALID_ARGUMENT)
    if out.contents.version != N.NVML_GPM_SUPPORT_VERSION:
        raise _Return(N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    out.contents.isSupportedDevice = int(gpu.model.gpm)


@_export(POINTER(N.c_nvmlGpmSample_t))
def _nvmlGpmSampleAlloc(lib: SimNvmlLib, out: Any) -> None:
    lib._initialized_node()
    if not out:
        raise _Return(N.NVML_ERROR_INVALID_ARGUMENT)
    with lib._lock:
        sample = _GpmSample(next(lib._gpm_addresses))
        lib._gpm_samples[sample.address] = sample
    _put(out, ctypes.cast(c_void_p(sample.address), N.c_nvmlGpmSample_t))


@_export(_GPM_SAMPLE)
def _nvmlGpmSampleFree(lib: SimNvmlLib, address: int) -> None:
    with lib._lock:
        if lib._gpm_samples.pop(address or 0, None) is None:
            raise _Return(N.NVML_ERROR_INVALID_ARGUMENT)


@_export(_DEV, _GPM_SAMPLE)
def _nvmlGpmSampleGet(lib: SimNvmlLib, handle: int, address: int) -> None:
    gpu = _gpm_device(lib, handle)
    sample = lib._gpm_sample(address)
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


@_export(POINTER(N.c_nvmlGpmMetricsGet_t))
def _nvmlGpmMetricsGet(lib: SimNvmlLib, request: Any) -> None:
    if not request:
        raise _Return(N.NVML_ERROR_INVALID_ARGUMENT)
    req = request.contents
    if req.version != N.NVML_GPM_METRICS_GET_VERSION:
        raise _Return(N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    if req.numMetrics > len(req.metrics):
        raise _Return(N.NVML_ERROR_INVALID_ARGUMENT)
    first = lib._gpm_sample(ctypes.cast(req.sample1, c_void_p).value)
    second = lib._gpm_sample(ctypes.cast(req.sample2, c_void_p).value)
    if first.gpu is None or second.gpu is not first.gpu:
        raise _Return(N.NVML_ERROR_INVALID_ARGUMENT)  # unfilled, or from two different GPUs
    lib._check(first.gpu)
    for i in range(req.numMetrics):
        metric = req.metrics[i]
        known = _GPM_METRICS.get(metric.metricId)
        if known is None:
            metric.nvmlReturn = N.NVML_ERROR_NOT_SUPPORTED
            continue
        counter, current, info = known
        metric.value = _gpm_util(first, second, counter, current)
        metric.metricInfo.shortName, metric.metricInfo.longName, metric.metricInfo.unit = info
        metric.nvmlReturn = N.NVML_SUCCESS


__all__ = ["PRE_535_DRIVER", "SimNvmlLib"]
