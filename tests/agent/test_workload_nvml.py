"""agent/workload/nvml.py: the processes on each GPU through the real pynvml, over a fake library
with the running-process entry points (tests/agent/proc_lib.py)."""

from __future__ import annotations

import pynvml as N
import pytest

from agent.workload.nvml import GpuProcess, NvmlProcesses
from tests.agent.proc_lib import ProcLib

GIB = 1 << 30


@pytest.fixture
def lib(install):
    return install(ProcLib())


def test_compute_graphics_and_mps_lists_merged_by_pid(lib):
    lib.procs[(1, "compute")] = [(100, 30 * GIB), (101, 2 * GIB)]
    lib.procs[(1, "graphics")] = [(101, 3 * GIB), (102, None)]
    lib.procs[(1, "mps")] = [(103, GIB)]
    procs = NvmlProcesses()
    assert sorted(procs.read(1), key=lambda p: p.pid) == [
        GpuProcess(100, 30 * GIB), GpuProcess(101, 3 * GIB), GpuProcess(102, None), GpuProcess(103, GIB)]
    assert procs.errors == {"nvml_not_supported": 0, "nvml_no_permission": 0, "nvml_failed": 0}


def test_an_idle_gpu_is_an_empty_list_in_one_call_per_kind(lib):
    procs = NvmlProcesses()
    assert procs.read(2) == []
    assert lib.calls == ["nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v3",
                         "nvmlDeviceGetMPSComputeRunningProcesses_v3"]


def test_an_older_driver_without_v3_gets_v2_from_then_on(install):
    lib = install(ProcLib(versions=("_v2",)))
    lib.procs[(1, "compute")] = [(100, GIB)]
    procs = NvmlProcesses(kinds=("compute",))
    assert procs.read(1) == [GpuProcess(100, GIB)]
    assert procs.read(1) == [GpuProcess(100, GIB)]
    # _v3 is absent (FUNCTION_NOT_FOUND, never reaching the library); each read is then the size query and the fill
    assert lib.calls == ["nvmlDeviceGetComputeRunningProcesses_v2"] * 4
    assert procs.errors["nvml_failed"] == 0


def test_no_entry_point_at_all_is_not_supported(install):
    install(ProcLib(versions=()))
    procs = NvmlProcesses()
    assert procs.read(1) is None
    assert procs.errors == {"nvml_not_supported": 1, "nvml_no_permission": 0, "nvml_failed": 0}


@pytest.mark.parametrize("code, counter", [
    (N.NVML_ERROR_NOT_SUPPORTED, "nvml_not_supported"),
    (N.NVML_ERROR_NO_PERMISSION, "nvml_no_permission"),
    (N.NVML_ERROR_GPU_IS_LOST, "nvml_failed"),
    (N.NVML_ERROR_UNKNOWN, "nvml_failed"),
])
def test_a_gpu_that_cannot_say_is_none_not_idle_and_counted(lib, code, counter):
    for kind in ("compute", "graphics", "mps"):
        lib.errors[(3, kind)] = code
    lib.procs[(4, "compute")] = [(200, GIB)]
    procs = NvmlProcesses()
    assert procs.read_all([3, 4, None]) == [None, [GpuProcess(200, GIB)], None]
    assert procs.errors[counter] == 1 and sum(procs.errors.values()) == 1


def test_one_list_refused_while_another_answers_is_just_that_answer(lib):
    lib.errors[(1, "graphics")] = N.NVML_ERROR_NOT_SUPPORTED
    lib.errors[(1, "mps")] = N.NVML_ERROR_NO_PERMISSION
    lib.procs[(1, "compute")] = [(100, GIB)]
    procs = NvmlProcesses()
    assert procs.read(1) == [GpuProcess(100, GIB)]
    assert sum(procs.errors.values()) == 0
