"""The running-process lists of each GPU (the answering itself: agent/sim/processes.py)."""

from __future__ import annotations

from collections.abc import Callable
from ctypes import POINTER, c_int, c_uint, c_void_p
from typing import Any

from agent.sim.libnvml.abi import DEV, Exports
from agent.sim.libnvml.driver import Driver
from agent.sim.processes import PROCESS_LISTS, VERSIONS, answer_processes

EXPORTS = Exports()


def _process_list(kind: str) -> Callable[..., Any]:
    def impl(driver: Driver, handle: int, count: Any, infos: int | None) -> int:
        gpu = driver.device(handle)
        if kind != "compute":  # a training node: nothing graphics, no MPS server
            return answer_processes((), count, infos)
        procs = gpu.processes
        # A process of unset memory holds its share of what the GPU has in use.
        share = gpu.state.mem_used_bytes // max(1, sum(1 for p in procs if p.used_bytes is None))
        return answer_processes([(p.pid, share if p.used_bytes is None else p.used_bytes) for p in procs], count, infos)

    return impl


for _kind, _base in PROCESS_LISTS.items():
    for _version in VERSIONS:
        EXPORTS[_base + _version] = (c_int, (DEV, POINTER(c_uint), c_void_p), _process_list(_kind))
