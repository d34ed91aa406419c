"""NVML's running-process lists as a driver answers them, shared by the simulated libnvidia-ml
(agent/sim/libnvml/) and the tests' process-only library (tests/agent/proc_lib.py).

nvmlReturn_t nvmlDeviceGet{Compute,Graphics,MPSCompute}RunningProcesses_v{2,3}(nvmlDevice_t,
unsigned int *infoCount, nvmlProcessInfo_t *infos): with no array (or one too small) the driver
answers INSUFFICIENT_SIZE and the count (SUCCESS and 0 when there are none), else fills the
array. pynvml's own two-call protocol and struct decoding run unchanged over `answer_processes`.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from ctypes import POINTER

import pynvml as N

# kind → base name of its entry points (suffixed _v3 and _v2).
PROCESS_LISTS = {"compute": "nvmlDeviceGetComputeRunningProcesses", "graphics": "nvmlDeviceGetGraphicsRunningProcesses",
                 "mps": "nvmlDeviceGetMPSComputeRunningProcesses"}
VERSIONS = ("_v3", "_v2")
NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF  # usedGpuMemory a driver cannot tell (pynvml reads it as None)
_NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId outside MIG


def answer_processes(procs: Sequence[tuple[int, int | None]], count, infos) -> int:
    """Answer one call for these (pid, used bytes or None) processes; returns the nvmlReturn_t.
    `count` is the unsigned int * argument, `infos` the array's address (None/0: a size query)."""
    if not count:
        return N.NVML_ERROR_INVALID_ARGUMENT
    if not infos:
        count[0] = len(procs)
        return N.NVML_SUCCESS if not procs else N.NVML_ERROR_INSUFFICIENT_SIZE
    if count[0] < len(procs):
        count[0] = len(procs)
        return N.NVML_ERROR_INSUFFICIENT_SIZE
    # nvmlProcessInfo_v2_t and _v3 (nvmlProcessInfo_t) have one layout.
    array = ctypes.cast(infos, POINTER(N.c_nvmlProcessInfo_v2_t))
    for i, (pid, used) in enumerate(procs):
        array[i].pid = pid
        array[i].usedGpuMemory = NOT_AVAILABLE if used is None else used
        array[i].gpuInstanceId = _NO_INSTANCE
        array[i].computeInstanceId = _NO_INSTANCE
    count[0] = len(procs)
    return N.NVML_SUCCESS
