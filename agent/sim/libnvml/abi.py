"""The C side of the fake: how a Python function becomes an NVML entry point, and how it answers.

Each family module lists its entry points in an `Exports` table; SimNvmlLib wraps each in a
CFUNCTYPE of its C signature (nvml.h: nvmlReturn_t result, outputs written through pointer
arguments). An implementation answers an error by raising NvmlReturn; returning normally is
NVML_SUCCESS.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from ctypes import c_int, c_void_p
from typing import Any

import pynvml as N

# nvmlDevice_t / nvmlEventSet_t / nvmlGpmSample_t are opaque pointers: the callbacks see their integer values.
DEV = c_void_p
EVENT_SET = c_void_p
GPM_SAMPLE = c_void_p
UINT_MAX = 0xFFFFFFFF
KIB = 1024

# name -> (restype, argtypes, implementation taking the Driver first)
Entry = tuple[Any, tuple[Any, ...], Callable[..., Any]]


class Exports(dict[str, Entry]):
    """One family's entry points, by C name."""

    def c(self, *argtypes: Any, restype: Any = c_int) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register `_nvmlX(driver, *args)` as the C function nvmlX(args) with these argument types."""

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            self[fn.__name__[1:]] = (restype, argtypes, fn)
            return fn

        return register


class NvmlReturn(Exception):
    """Return early from a simulated call with this nvmlReturn_t."""

    def __init__(self, code: int) -> None:
        self.code = code


def put(ptr: Any, value: Any) -> None:
    if not ptr:
        raise NvmlReturn(N.NVML_ERROR_INVALID_ARGUMENT)
    ptr[0] = value


def put_str(address: int | None, size: int, text: str) -> None:
    if not address:
        raise NvmlReturn(N.NVML_ERROR_INVALID_ARGUMENT)
    data = text.encode() + b"\0"
    if len(data) > size:
        raise NvmlReturn(N.NVML_ERROR_INSUFFICIENT_SIZE)
    ctypes.memmove(address, data, len(data))


def put_handle(ptr: Any, handle: int) -> None:
    put(ptr, ctypes.cast(c_void_p(handle), N.c_nvmlDevice_t))


def require(ptr: Any) -> Any:
    """The struct a non-NULL pointer argument points at."""
    if not ptr:
        raise NvmlReturn(N.NVML_ERROR_INVALID_ARGUMENT)
    return ptr.contents


_ERROR_STRINGS: dict[int, ctypes.Array] = {}


def error_string_address(code: int) -> int:
    # nvmlErrorString returns const char*; keep one buffer per code alive for good.
    buf = _ERROR_STRINGS.get(code)
    if buf is None:
        text = N.NVMLError._errcode_to_string.get(code, "Unknown Error")
        buf = _ERROR_STRINGS.setdefault(code, ctypes.create_string_buffer(text.encode()))
    return ctypes.addressof(buf)
