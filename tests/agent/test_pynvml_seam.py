"""Guards the pynvml internals the simulated library relies on.

agent.sim.install swaps the C library under pynvml. If an nvidia-ml-py upgrade changes how
pynvml loads or looks up functions, these fail loudly instead of the simulator silently
talking to nothing (or to a real driver).
"""

from __future__ import annotations

import ctypes
import inspect
import threading

import pynvml
import pytest

from agent.sim.gpu import SimNode
from agent.sim.install import install_simulated_nvml, uninstall_simulated_nvml
from agent.sim.libnvml import SimNvmlLib


def test_module_globals_exist():
    assert hasattr(pynvml, "nvmlLib")
    assert isinstance(pynvml._nvmlGetFunctionPointer_cache, dict)
    assert isinstance(pynvml.libLoadLock, type(threading.Lock()))


def test_function_lookup_is_getattr_on_nvmllib_and_cached():
    src = inspect.getsource(pynvml._nvmlGetFunctionPointer)
    assert "getattr(nvmlLib, name)" in src
    assert "_nvmlGetFunctionPointer_cache[name]" in src
    assert "NVML_ERROR_FUNCTION_NOT_FOUND" in src


def test_load_skips_when_nvmllib_is_set():
    src = inspect.getsource(pynvml._LoadNvmlLibrary)
    assert "if (nvmlLib == None)" in src.replace("is None", "== None")


def test_init_goes_through_load_then_lookup():
    src = inspect.getsource(pynvml.nvmlInitWithFlags)
    assert "_LoadNvmlLibrary()" in src
    assert '_nvmlGetFunctionPointer("nvmlInitWithFlags")' in src


def test_install_routes_calls_to_the_fake_and_uninstall_restores(install):
    node = SimNode("seam", "h100", 2)
    lib = SimNvmlLib(node)
    before = pynvml.nvmlLib
    with install_simulated_nvml(lib):
        assert pynvml.nvmlLib is lib
        pynvml.nvmlInit()
        try:
            assert pynvml.nvmlDeviceGetCount() == 2
            assert pynvml._nvmlGetFunctionPointer_cache["nvmlDeviceGetCount_v2"] is lib.nvmlDeviceGetCount_v2
        finally:
            pynvml.nvmlShutdown()
    assert pynvml.nvmlLib is before
    assert pynvml._nvmlGetFunctionPointer_cache == {}


def test_install_clears_stale_function_pointers():
    a, b = SimNvmlLib(SimNode("a", "h100", 1)), SimNvmlLib(SimNode("b", "a100", 3))
    install_simulated_nvml(a)
    try:
        pynvml.nvmlInit()
        assert pynvml.nvmlDeviceGetCount() == 1
        pynvml.nvmlShutdown()
        install_simulated_nvml(b)
        try:
            pynvml.nvmlInit()
            assert pynvml.nvmlDeviceGetCount() == 3
            pynvml.nvmlShutdown()
        finally:
            uninstall_simulated_nvml()
    finally:
        uninstall_simulated_nvml()


def test_missing_function_raises_function_not_found(install):
    lib = install(SimNvmlLib(SimNode("old", "h100", 1), omit={"nvmlDeviceGetCurrentClocksEventReasons"}))
    assert not hasattr(lib, "nvmlDeviceGetCurrentClocksEventReasons")
    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            pynvml.nvmlDeviceGetGspFirmwareVersion(h)  # never implemented at all
    finally:
        pynvml.nvmlShutdown()


def test_error_codes_map_to_pynvml_exceptions_and_strings(install):
    node = SimNode("err", "rtx4090", 1)
    install(SimNvmlLib(node))
    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError_NotSupported) as exc:
            pynvml.nvmlDeviceGetNvLinkState(h, 0)
        assert str(exc.value) == "Not Supported"
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetHandleByIndex(5)
        # nvmlErrorString is a const char* return: pynvml flips restype to c_char_p on our pointer.
        assert pynvml.nvmlErrorString(pynvml.NVML_ERROR_GPU_IS_LOST) == "GPU is lost"
    finally:
        pynvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()


def test_gpm_layouts_and_calls_the_reader_and_simulator_rely_on():
    # agent/nvml/readers/tensor_activity.py fills nvmlGpmMetricsGet_t itself and the simulated
    # library reads it through POINTER(c_nvmlGpmMetricsGet_t): both need pynvml's layout.
    def names(struct):
        return [f[0] for f in struct._fields_]

    assert names(pynvml.c_nvmlGpmMetricsGet_t) == ["version", "numMetrics", "sample1", "sample2", "metrics"]
    assert names(pynvml.c_nvmlGpmMetric_t) == ["metricId", "nvmlReturn", "value", "metricInfo"]
    assert names(pynvml.c_nvmlGpmSupport_t) == ["version", "isSupportedDevice"]
    assert pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL == 5
    assert pynvml.NVML_GPM_METRICS_GET_VERSION == 1 and pynvml.NVML_GPM_SUPPORT_VERSION == 1
    assert "fn(byref(metricsGet))" in inspect.getsource(pynvml.nvmlGpmMetricsGet)
    assert "fn(device, gpmSample)" in inspect.getsource(pynvml.nvmlGpmSampleGet)
    assert "fn(byref(gpmSample))" in inspect.getsource(pynvml.nvmlGpmSampleAlloc)


def test_field_value_view_has_pynvmls_layout():
    from agent.nvml.session import FieldValueView

    # Read through the view, written through pynvml's class: the same bytes.
    assert ctypes.sizeof(FieldValueView) == ctypes.sizeof(pynvml.c_nvmlFieldValue_t)
    values = (pynvml.c_nvmlFieldValue_t * 2)()
    values[1].fieldId, values[1].scopeId = pynvml.NVML_FI_DEV_MEMORY_TEMP, 7
    values[1].valueType, values[1].nvmlReturn = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, pynvml.NVML_ERROR_NOT_SUPPORTED
    values[1].value.ullVal = 2**40 + 3
    view = (FieldValueView * 2).from_buffer(values)
    assert (view[1].fieldId, view[1].scopeId, view[1].valueType, view[1].nvmlReturn, view[1].value.ullVal) == (
        pynvml.NVML_FI_DEV_MEMORY_TEMP, 7, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
        pynvml.NVML_ERROR_NOT_SUPPORTED, 2**40 + 3)
