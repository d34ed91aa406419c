"""NVML init/shutdown and the error classification every reader shares.

pynvml turns each nvmlReturn_t into an NVMLError subclass; the agent only needs three
classes of them: "the GPU does not have this" (leave the field None, not an error),
"the GPU is gone" (report it lost) and everything else (count a reader error).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import pynvml
from pynvml import NVMLError

T = TypeVar("T")

# FUNCTION_NOT_FOUND is what an older driver answers for a newer entry point: for a
# metric that is the same as "this GPU/driver does not expose it".
UNSUPPORTED_CODES = frozenset({pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND})
# "Fallen off the bus or otherwise inaccessible" (nvml.h).
LOST_CODES = frozenset({pynvml.NVML_ERROR_GPU_IS_LOST})

# scopeId meaning "sum over all links" for the NVLink throughput field values (nvml.h).
ALL_LINKS_SCOPE = 0xFFFFFFFF


def is_unsupported(err: BaseException) -> bool:
    return isinstance(err, NVMLError) and err.value in UNSUPPORTED_CODES


def is_lost(err: BaseException) -> bool:
    return isinstance(err, NVMLError) and err.value in LOST_CODES


def optional(call: Callable[..., T], *args: Any) -> T | None:
    """call(*args), or None when NVML says the metric is not supported; other errors raise."""
    try:
        return call(*args)
    except NVMLError as err:
        if err.value in UNSUPPORTED_CODES:
            return None
        raise


_VALUE_MEMBER = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}


class FieldValueView(ctypes.Structure):
    """pynvml's nvmlFieldValue_t layout (its own _fields_) as a plain ctypes struct.

    pynvml's struct classes route every attribute get and set through Python-level hooks
    (for printing); reading a returned array through this view of the same memory costs a
    fraction of that, and the field values are read for every GPU on every cycle."""

    _fields_ = pynvml.c_nvmlFieldValue_t._fields_


def field_values(handle: Any, field_ids: list[Any]) -> list[int | float | None]:
    """nvmlDeviceGetFieldValues decoded: one value per id, None where that field is unsupported.

    Each entry carries its own nvmlReturn; an unsupported field leaves only itself None, any
    other per-field error raises like a failed call would.
    """
    try:
        values = pynvml.nvmlDeviceGetFieldValues(handle, field_ids)
    except NVMLError as err:
        if err.value in UNSUPPORTED_CODES:
            return [None] * len(field_ids)
        raise
    out: list[int | float | None] = []
    for fv in (FieldValueView * len(values)).from_buffer(values):
        if fv.nvmlReturn in UNSUPPORTED_CODES:
            out.append(None)
        elif fv.nvmlReturn != pynvml.NVML_SUCCESS:
            raise NVMLError(fv.nvmlReturn)
        else:
            member = _VALUE_MEMBER.get(fv.valueType)
            out.append(None if member is None else getattr(fv.value, member))
    return out


class NvmlSession:
    """One nvmlInit ... nvmlShutdown pair; close() is idempotent.

    NVML counts inits, so several sessions (one per sampled node in the demo, or a
    source plus a one-off CLI query) can overlap safely as long as each closes once.
    """

    def __init__(self) -> None:
        pynvml.nvmlInit()
        self._open = True
        self._lock = threading.Lock()

    @property
    def is_open(self) -> bool:
        return self._open

    def close(self) -> None:
        with self._lock:
            if not self._open:
                return
            self._open = False
        try:
            pynvml.nvmlShutdown()
        except NVMLError:
            pass  # nothing left to release; shutting down twice is harmless

    def __enter__(self) -> NvmlSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def driver_version() -> str | None:
        try:
            return str(pynvml.nvmlSystemGetDriverVersion())
        except NVMLError:
            return None

    @staticmethod
    def cuda_version() -> str | None:
        """The CUDA version the driver supports, "12.2" style (NVML gives 12020)."""
        try:
            v = int(pynvml.nvmlSystemGetCudaDriverVersion())
        except NVMLError:
            return None
        return f"{v // 1000}.{(v % 1000) // 10}"
