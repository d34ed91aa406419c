"""Put a simulated NVML library under pynvml (and take it away again).

pynvml keeps the loaded C library in the module global `nvmlLib` and only loads
libnvidia-ml.so when that is None; every function is then looked up with getattr on it and
cached in `_nvmlGetFunctionPointer_cache`. Setting the global and clearing the cache is the
whole seam (guarded by tests/agent/test_pynvml_seam.py).
"""

from __future__ import annotations

from typing import Any

import pynvml

_previous: list[Any] = []


class _Installed:
    def __init__(self, lib: Any) -> None:
        self.lib = lib

    def __enter__(self) -> Any:
        return self.lib

    def __exit__(self, *exc: object) -> None:
        uninstall_simulated_nvml()


def install_simulated_nvml(lib: Any) -> _Installed:
    """Make pynvml call `lib`; usable as `with install_simulated_nvml(lib): ...` too."""
    with pynvml.libLoadLock:
        _previous.append(pynvml.nvmlLib)
        pynvml.nvmlLib = lib
        # Cached pointers belong to the previous library.
        pynvml._nvmlGetFunctionPointer_cache.clear()
    return _Installed(lib)


def uninstall_simulated_nvml() -> None:
    """Restore whatever pynvml had before the matching install (normally nothing loaded)."""
    with pynvml.libLoadLock:
        pynvml.nvmlLib = _previous.pop() if _previous else None
        pynvml._nvmlGetFunctionPointer_cache.clear()
