"""The processes on each GPU, from NVML: compute, graphics and MPS client lists, merged by PID.

pynvml's unversioned calls raise NVMLLibraryMismatchError on a driver without the _v3 entry
points (before R510), so the versioned ones are called: _v3, then _v2 once a driver answered
FUNCTION_NOT_FOUND for _v3. A GPU that cannot say (NotSupported; NoPermission, e.g. a MIG GPU
listed on its parent handle by an unprivileged caller) gives None, not [], so it is not mistaken
for idle, and is counted; one list that cannot say while another can (graphics on a
compute-only board) is just empty.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import pynvml
from pynvml import NVMLError

from agent.nvml.session import UNSUPPORTED_CODES

log = logging.getLogger(__name__)

# One process list per kind, newest version first.
_LISTS = {
    "compute": ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"),
    "graphics": ("nvmlDeviceGetGraphicsRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v2"),
    "mps": ("nvmlDeviceGetMPSComputeRunningProcesses_v3", "nvmlDeviceGetMPSComputeRunningProcesses_v2"),
}


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int
    used_bytes: int | None = None  # GPU memory the process holds on this GPU; None: not reported


class NvmlProcesses:
    """read(handle) → the GPU's processes (deduplicated by PID), or None when NVML cannot say.

    `errors`: "nvml_not_supported", "nvml_no_permission", "nvml_failed" (any other error, the
    GPU lost included), per GPU read."""

    def __init__(self, kinds: Sequence[str] = ("compute", "graphics", "mps")) -> None:
        self._kinds = [k for k in _LISTS if k in kinds]
        self._version = dict.fromkeys(self._kinds, 0)  # index into _LISTS[kind]
        self.errors = {"nvml_not_supported": 0, "nvml_no_permission": 0, "nvml_failed": 0}

    def read(self, handle: object) -> list[GpuProcess] | None:
        merged: dict[int, GpuProcess] = {}
        refused: NVMLError | None = None
        answered = False
        for kind in self._kinds:
            try:
                procs = self._list(kind, handle)
            except NVMLError as err:
                refused = refused or err
                continue
            if procs is None:
                continue
            answered = True
            for p in procs:
                pid, used = int(p.pid), p.usedGpuMemory
                seen = merged.get(pid)
                if seen is None or (used is not None and (seen.used_bytes is None or used > seen.used_bytes)):
                    merged[pid] = GpuProcess(pid, used)
        if answered:
            return list(merged.values())
        self._count(refused)
        return None

    def read_all(self, handles: Sequence[object | None]) -> list[list[GpuProcess] | None]:
        return [None if h is None else self.read(h) for h in handles]

    def _list(self, kind: str, handle: object) -> list | None:
        """The list, or None when this kind is not there (not supported / no such entry point).
        Raises NVMLError for any other error."""
        names = _LISTS[kind]
        while self._version[kind] < len(names):
            fn = getattr(pynvml, names[self._version[kind]])
            try:
                return fn(handle)
            except NVMLError as err:
                if err.value == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                    self._version[kind] += 1  # an older driver: try the older entry point from now on
                    continue
                if err.value in UNSUPPORTED_CODES:
                    return None
                raise
        return None

    def _count(self, err: NVMLError | None) -> None:
        if err is None or err.value in UNSUPPORTED_CODES:
            self.errors["nvml_not_supported"] += 1
        elif err.value == pynvml.NVML_ERROR_NO_PERMISSION:
            self.errors["nvml_no_permission"] += 1
        else:
            self.errors["nvml_failed"] += 1
