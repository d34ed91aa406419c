"""Tensor-pipe activity through GPM: the reader on real pynvml over the simulated library."""

from __future__ import annotations

import ctypes

import pynvml
import pytest

from agent.nvml.readers import READERS, bind_readers, tensor_activity
from agent.nvml.source import NvmlGpuSource
from agent.sim.gpu import SimNode
from agent.sim.libnvml import SimNvmlLib

GPM_FUNCTIONS = {"nvmlGpmQueryDeviceSupport", "nvmlGpmSampleAlloc", "nvmlGpmSampleFree", "nvmlGpmSampleGet", "nvmlGpmMetricsGet"}


def tensor(src: NvmlGpuSource, node: SimNode, ts: float) -> list[float | None]:
    node.advance(ts)
    return [s.tensor_active_pct for s in src.read(ts)]


@pytest.mark.parametrize("model", ["h100", "h200"])
def test_null_first_then_busy_above_idle(install, model):
    node = SimNode("n", model, 8, workload="busy", seed=3)
    node.set_workload("idle", gpus=[5, 6, 7])
    lib = install(SimNvmlLib(node))
    with NvmlGpuSource() as src:
        assert tensor(src, node, 0.0) == [None] * 8
        for ts in (10.0, 20.0):
            values = tensor(src, node, ts)
            busy, idle = values[:5], values[5:]
            assert all(40.0 <= v <= 70.0 for v in busy), busy
            assert all(0.0 <= v < 1.0 for v in idle), idle
            # The simulated truth: activity over the interval just ended.
            assert values == [pytest.approx(g.state.tensor_active_pct) for g in node.gpus]
        assert src.reader_errors["tensor_activity"] == 0
        assert lib.gpm_samples_allocated == 16  # two per GPU, reused cycle after cycle
    assert lib.gpm_samples_allocated == 0  # freed on close


def test_a100_has_no_gpm(install):
    node = SimNode("ampere", "a100", 4, workload="busy")
    lib = install(SimNvmlLib(node))
    with NvmlGpuSource() as src:
        for ts in (0.0, 10.0, 20.0):
            assert tensor(src, node, ts) == [None] * 4
        assert src.reader_errors["tensor_activity"] == 0
        assert lib.gpm_samples_allocated == 0  # asked once, never sampled


def test_a100_sampling_answers_not_supported(install):
    node = SimNode("ampere", "a100", 1)
    install(SimNvmlLib(node))
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice == 0
        sample = pynvml.nvmlGpmSampleAlloc()
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlGpmSampleGet(handle, sample)
        pynvml.nvmlGpmSampleFree(sample)
    finally:
        pynvml.nvmlShutdown()


def test_a_slowed_gpu_drops_below_its_peers(install):
    node = SimNode("n", "h100", 8, workload="busy", seed=5)
    node.inject(3, "thermal")
    node.inject(6, "power_brake")
    install(SimNvmlLib(node))
    with NvmlGpuSource() as src:
        tensor(src, node, 0.0)
        values = tensor(src, node, 10.0)
    healthy = [v for i, v in enumerate(values) if i not in (3, 6)]
    assert values[3] < 0.7 * min(healthy)
    assert values[6] < 0.1 * min(healthy)


def test_the_metric_spans_the_whole_interval_between_cycles(install):
    node = SimNode("n", "h100", 2, workload="busy", seed=1)
    install(SimNvmlLib(node))
    with NvmlGpuSource() as src:
        tensor(src, node, 0.0)
        node.advance(10.0)  # busy 0..10 s, not sampled
        busy_pct = node.gpus[0].state.tensor_active_pct
        node.set_workload("idle")
        values = tensor(src, node, 20.0)  # idle 10..20 s
    assert values[0] == pytest.approx(busy_pct / 2)


def test_two_sources_keep_their_own_previous_sample(install):
    node = SimNode("n", "h100", 1, workload="busy", seed=2)
    install(SimNvmlLib(node))
    with NvmlGpuSource() as a, NvmlGpuSource() as b:
        tensor(a, node, 0.0)
        node.advance(10.0)
        busy_pct = node.gpus[0].state.tensor_active_pct
        assert tensor(b, node, 10.0) == [None]  # b's own first cycle, a's sample untouched
        node.set_workload("idle")
        assert tensor(a, node, 20.0) == [pytest.approx(busy_pct / 2)]  # 0..20 s, not 10..20 s
        assert tensor(b, node, 20.0) == [pytest.approx(0.0)]


def test_a_reset_gpu_starts_over(install):
    node = SimNode("n", "h100", 2, workload="busy")
    install(SimNvmlLib(node))
    with NvmlGpuSource() as src:
        tensor(src, node, 0.0)
        assert None not in tensor(src, node, 10.0)
        node.inject(1, "lost")
        assert tensor(src, node, 20.0) == [pytest.approx(node.gpus[0].state.tensor_active_pct), None]
        node.clear(1, "lost")  # back with a new handle: its counters restarted
        assert tensor(src, node, 30.0)[1] is None
        assert tensor(src, node, 40.0)[1] == pytest.approx(node.gpus[1].state.tensor_active_pct)
        assert src.reader_errors["tensor_activity"] == 0


def test_a_driver_without_gpm_leaves_it_null(install):
    node = SimNode("old", "h100", 2)
    install(SimNvmlLib(node, omit=GPM_FUNCTIONS))
    with NvmlGpuSource() as src:
        for ts in (0.0, 10.0):
            assert tensor(src, node, ts) == [None, None]
        assert src.reader_errors["tensor_activity"] == 0


def test_a_failing_metrics_call_is_a_reader_error_and_recovers(install):
    node = SimNode("n", "h100", 2, workload="busy")
    install(SimNvmlLib(node))
    with NvmlGpuSource() as src:
        tensor(src, node, 0.0)
        node.gpus[1].call_errors["nvmlGpmMetricsGet"] = pynvml.NVML_ERROR_NO_PERMISSION
        values = tensor(src, node, 10.0)
        assert values[0] is not None and values[1] is None
        assert src.reader_errors["tensor_activity"] == 1
        del node.gpus[1].call_errors["nvmlGpmMetricsGet"]
        assert tensor(src, node, 20.0)[1] == pytest.approx(node.gpus[1].state.tensor_active_pct)


def test_a_metric_the_driver_lacks_is_null_not_an_error(install, monkeypatch):
    # Per-metric NOT_SUPPORTED inside a successful nvmlGpmMetricsGet (the simulated driver
    # computes the tensor, graphics and DRAM metrics only): that field alone stays null.
    metrics = {pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: "tensor_active_pct", pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: "dram_active_pct"}
    monkeypatch.setattr(tensor_activity, "METRICS", metrics)
    node = SimNode("n", "h100", 1, workload="busy")
    install(SimNvmlLib(node))
    with NvmlGpuSource() as src:
        tensor(src, node, 0.0)
        node.advance(10.0)
        (sample,) = src.read(10.0)
        assert sample.tensor_active_pct is None
        assert sample.dram_active_pct == pytest.approx(node.gpus[0].state.dram_active_pct)
        assert src.reader_errors["tensor_activity"] == 0


def test_stateful_reader_is_bound_per_source():
    template = next(r for r in READERS if r.name == "tensor_activity")
    with pytest.raises(TypeError, match="per source"):
        template.read(None, None)
    first, second = bind_readers([template]), bind_readers([template])
    assert first[0].read.__self__ is not second[0].read.__self__
    assert first[0].close is not None and first[0].per_source is None


def test_simulated_metrics_get_checks_its_request(install):
    node = SimNode("n", "h100", 2)
    install(SimNvmlLib(node))
    node.advance(0.0)
    pynvml.nvmlInit()
    try:
        h0, h1 = pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlDeviceGetHandleByIndex(1)
        a, b = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()

        def request(first, second, version=pynvml.NVML_GPM_METRICS_GET_VERSION):
            req = pynvml.c_nvmlGpmMetricsGet_t()
            req.version, req.numMetrics, req.sample1, req.sample2 = version, 1, first, second
            req.metrics[0].metricId = pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL
            return req

        with pytest.raises(pynvml.NVMLError_InvalidArgument):  # samples not filled yet
            pynvml.nvmlGpmMetricsGet(request(a, b))
        pynvml.nvmlGpmSampleGet(h0, a)
        pynvml.nvmlGpmSampleGet(h1, b)
        with pytest.raises(pynvml.NVMLError_InvalidArgument):  # two different GPUs
            pynvml.nvmlGpmMetricsGet(request(a, b))
        node.advance(5.0)
        pynvml.nvmlGpmSampleGet(h0, b)
        with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
            pynvml.nvmlGpmMetricsGet(request(a, b, version=99))
        result = pynvml.nvmlGpmMetricsGet(request(a, b)).metrics[0]
        assert result.nvmlReturn == pynvml.NVML_SUCCESS
        assert result.metricInfo.unit == b"%"
        assert result.value == pytest.approx(node.gpus[0].state.tensor_active_pct)
        pynvml.nvmlGpmSampleFree(a)
        with pytest.raises(pynvml.NVMLError_InvalidArgument):  # freed
            pynvml.nvmlGpmSampleGet(h0, a)
        pynvml.nvmlGpmSampleFree(b)
    finally:
        pynvml.nvmlShutdown()


def test_handle_address_is_the_pointer_value():
    handle = ctypes.cast(ctypes.c_void_p(0x12300), pynvml.c_nvmlDevice_t)
    assert tensor_activity.handle_address(handle) == 0x12300
