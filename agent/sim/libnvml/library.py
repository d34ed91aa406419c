"""SimNvmlLib: the object pynvml takes for the loaded libnvidia-ml.so.

pynvml resolves every C function with getattr(pynvml.nvmlLib, name); this answers with a
ctypes function pointer per entry point of the families below, each calling its Python
implementation with the shared Driver.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator
from ctypes import CFUNCTYPE, c_int
from typing import Any

import pynvml as N

from agent.sim.gpu import SimNode
from agent.sim.libnvml import errors, fields, gpm, links, process_lists, readings, system
from agent.sim.libnvml.abi import Entry, NvmlReturn, error_string_address
from agent.sim.libnvml.driver import Driver

log = logging.getLogger(__name__)

FAMILIES = (system, readings, fields, links, errors, process_lists, gpm)


def _entry_points() -> dict[str, Entry]:
    api: dict[str, Entry] = {}
    for family in FAMILIES:
        twice = api.keys() & family.EXPORTS.keys()
        if twice:
            raise RuntimeError(f"{family.__name__} exports {sorted(twice)} again")
        api.update(family.EXPORTS)
    return api


_API = _entry_points()


class SimNvmlLib:
    def __init__(self, default_node: SimNode | None = None, *, omit: Iterable[str] = ()) -> None:
        omit = frozenset(omit)
        if omit - set(_API):
            raise ValueError(f"cannot omit unknown functions: {sorted(omit - set(_API))}")
        self._driver = Driver(default_node)
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

    @property
    def default_node(self) -> SimNode | None:
        return self._driver.default_node

    @default_node.setter
    def default_node(self, node: SimNode | None) -> None:
        self._driver.default_node = node

    @contextlib.contextmanager
    def node(self, sim_node: SimNode, *, at: float | None = None) -> Iterator[SimNode]:
        """Make `sim_node` this thread's node for per-node calls; optionally advance it to `at` first."""
        self._driver.enter_node(sim_node)
        try:
            if at is not None:
                sim_node.advance(at)
            yield sim_node
        finally:
            self._driver.leave_node()

    @property
    def current_node(self) -> SimNode | None:
        return self._driver.current_node

    def init_count(self, node: SimNode) -> int:
        return self._driver.inits.get(node, 0)

    @property
    def gpm_samples_allocated(self) -> int:
        """GPM samples allocated and not freed yet (a leak check for tests)."""
        return len(self._driver.gpm_samples)

    def _guard(self, name: str, impl: Callable[..., Any], restype: Any) -> Callable[..., Any]:
        # An exception escaping a ctypes callback would be printed and read as 0 = SUCCESS.
        driver = self._driver
        if restype is not c_int:

            def raw(*args: Any) -> Any:
                try:
                    return impl(driver, *args)
                except Exception:
                    log.exception("simulated %s failed", name)
                    return error_string_address(N.NVML_ERROR_UNKNOWN)

            return raw

        def call(*args: Any) -> int:
            driver.calling(name)
            try:
                ret = impl(driver, *args)
                return N.NVML_SUCCESS if ret is None else ret
            except NvmlReturn as r:
                return r.code
            except Exception:
                log.exception("simulated %s failed", name)
                return N.NVML_ERROR_UNKNOWN

        return call
