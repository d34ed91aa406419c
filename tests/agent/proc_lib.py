"""A fake libnvidia-ml with just the running-process entry points, under the real pynvml.

Each function is a real ctypes function pointer with nvml.h's signature
(nvmlReturn_t f(nvmlDevice_t, unsigned int *count, nvmlProcessInfo_t *infos)), answering as the
driver does (agent.sim.processes, which the simulated GPUs' library answers with too), with
per-handle lists and errors set by the test. Installed with
agent.sim.install.install_simulated_nvml (the same seam as the simulated GPUs)."""

from __future__ import annotations

from ctypes import CFUNCTYPE, POINTER, c_int, c_uint, c_void_p

import pynvml as N

from agent.sim.processes import PROCESS_LISTS as KINDS
from agent.sim.processes import VERSIONS, answer_processes


class ProcLib:
    """procs[(handle, kind)] = [(pid, used bytes or None)]; errors[(handle, kind)] = nvmlReturn_t;
    `versions`: which of _v3/_v2 exist (an older driver lacks _v3)."""

    def __init__(self, versions: tuple[str, ...] = VERSIONS) -> None:
        self.procs: dict[tuple[int, str], list[tuple[int, int | None]]] = {}
        self.errors: dict[tuple[int, str], int] = {}
        self.calls: list[str] = []
        self._funcs = {}
        proto = CFUNCTYPE(c_int, c_void_p, POINTER(c_uint), c_void_p)
        for kind, base in KINDS.items():
            for v in versions:
                self._funcs[base + v] = proto(self._impl(kind, base + v))

    def __getattr__(self, name: str):
        funcs = self.__dict__.get("_funcs") or {}
        if name in funcs:
            return funcs[name]
        raise AttributeError(name)

    def _impl(self, kind: str, name: str):
        def fn(handle, count, infos):
            try:
                return self._answer(kind, name, handle or 0, count, infos)
            except Exception:  # an exception escaping a callback would read as SUCCESS
                return N.NVML_ERROR_UNKNOWN
        return fn

    def _answer(self, kind: str, name: str, handle: int, count, infos) -> int:
        self.calls.append(name)
        err = self.errors.get((handle, kind))
        if err is not None:
            return err
        return answer_processes(self.procs.get((handle, kind), []), count, infos)
