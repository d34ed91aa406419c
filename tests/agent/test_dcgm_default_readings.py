"""The readings behind dcgm-exporter's default series (issue #16): energy counter, video encoder
and decoder utilization, reserved framebuffer, row remap counts and failure, GPM graphics-engine
and DRAM activity. Real pynvml and the real readers over the simulated library."""

from __future__ import annotations

import pynvml
import pytest

from agent.nvml.source import NvmlGpuSource
from agent.sim.gpu import SimNode
from agent.sim.libnvml import SimNvmlLib
from agent.sim.models import MiB

NEW_FIELDS = ("energy_mj_total", "util_enc_pct", "util_dec_pct", "mem_reserved_bytes", "remapped_rows_correctable_total",
              "remapped_rows_uncorrectable_total", "remapped_rows_failure", "gr_engine_active_pct", "dram_active_pct")
GPM_FIELDS = ("gr_engine_active_pct", "dram_active_pct")


def read(src: NvmlGpuSource, node: SimNode, ts: float):
    node.advance(ts)
    return src.read(ts)


def test_a_busy_h100_reports_every_new_reading(install):
    node = SimNode("n", "h100", 8, workload="busy", seed=4)
    node.set_workload("idle", gpus=[6, 7])
    install(SimNvmlLib(node))
    with NvmlGpuSource() as src:
        first = read(src, node, 0.0)
        assert [[getattr(s, f) for f in GPM_FIELDS] for s in first] == [[None, None]] * 8  # GPM needs two samples
        samples = read(src, node, 10.0)
        assert sum(src.reader_errors.values()) == 0
    for s, g in zip(samples, node.gpus):
        assert None not in [getattr(s, f) for f in NEW_FIELDS], s
        # The simulated truth, averaged over the 10 s between the two GPM samples.
        assert s.gr_engine_active_pct == pytest.approx(g.state.gr_engine_active_pct)
        assert s.dram_active_pct == pytest.approx(g.state.dram_active_pct)
        assert s.mem_reserved_bytes == 551 * MiB  # realdata H100: "Reserved : 551 MiB"
        assert (s.util_enc_pct, s.util_dec_pct) == (0.0, 0.0)  # a training workload: as every GPU in realdata
        assert (s.remapped_rows_correctable_total, s.remapped_rows_uncorrectable_total, s.remapped_rows_failure) == (0, 0, False)
    busy, idle = samples[:6], samples[6:]
    assert all(95.0 <= s.gr_engine_active_pct <= 100.0 and 30.0 <= s.dram_active_pct <= 65.0 for s in busy), busy
    assert all(s.gr_engine_active_pct == 0.0 and s.dram_active_pct == 0.0 for s in idle)


def test_energy_is_a_millijoule_counter_of_the_power_drawn(install):
    node = SimNode("n", "h100", 2, workload="busy", seed=1)
    install(SimNvmlLib(node))
    with NvmlGpuSource() as src:
        before = read(src, node, 0.0)
        after = read(src, node, 30.0)
        power = [g.state.power_w for g in node.gpus]  # held through the 30 s just simulated
        node.set_workload("idle")
        idle = read(src, node, 60.0)
    for i in range(2):
        assert before[i].energy_mj_total > 86400 * 70 * 1000  # the driver was loaded days ago
        assert after[i].energy_mj_total - before[i].energy_mj_total == pytest.approx(power[i] * 30 * 1000, abs=1)  # W·s -> mJ
        assert 0 < idle[i].energy_mj_total - after[i].energy_mj_total < (after[i].energy_mj_total - before[i].energy_mj_total) / 5


def test_video_engine_utilization(install):
    node = SimNode("n", "h100", 2)
    node.gpus[1].enc_util, node.gpus[1].dec_util = 35, 80
    install(SimNvmlLib(node))
    with NvmlGpuSource() as src:
        s = src.read(0.0)
    assert [(g.util_enc_pct, g.util_dec_pct) for g in s] == [(0.0, 0.0), (35.0, 80.0)]
    pynvml.nvmlInit()
    try:  # the sampling period comes along, in µs
        util, period_us = pynvml.nvmlDeviceGetDecoderUtilization(pynvml.nvmlDeviceGetHandleByIndex(1))
        assert util == 80 and period_us > 0
    finally:
        pynvml.nvmlShutdown()


def test_reserved_memory_is_split_out_and_used_keeps_its_meaning(install):
    node = SimNode("n", "h100", 2, workload="idle")
    node.set_workload("busy", gpus=[1])
    lib = install(SimNvmlLib(node))
    with NvmlGpuSource() as src:
        idle, busy = src.read(0.0)
    # mem_used_bytes is v1's "used" (allocated + reserved), whichever call answered.
    assert idle.mem_used_bytes == idle.mem_reserved_bytes == 551 * MiB
    assert busy.mem_used_bytes == node.gpus[1].state.mem_used_bytes and busy.mem_reserved_bytes == 551 * MiB
    pynvml.nvmlInit()
    try:  # v2 as nvidia-smi shows it: total = reserved + used + free
        v2 = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(1), version=pynvml.nvmlMemory_v2)
        v1 = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(1))
        assert v2.total == v2.reserved + v2.used + v2.free == v1.total
        assert (v2.used + v2.reserved, v2.free) == (v1.used, v1.free)
        with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
            pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(1), version=1)
    finally:
        pynvml.nvmlShutdown()
    assert "nvmlDeviceGetMemoryInfo_v2" in lib.functions


def test_a_driver_without_memory_info_v2_falls_back_to_v1(install):
    node = SimNode("old", "h100", 1, workload="busy")
    install(SimNvmlLib(node, omit={"nvmlDeviceGetMemoryInfo_v2"}))
    with NvmlGpuSource() as src:
        (s,) = src.read(0.0)
        assert src.reader_errors["memory"] == 0
    assert s.mem_reserved_bytes is None
    assert (s.mem_used_bytes, s.mem_total_bytes) == (node.gpus[0].state.mem_used_bytes, 81559 * MiB)


def test_row_remap_counts_and_failure(install):
    node = SimNode("n", "a100", 3, workload="busy")
    install(SimNvmlLib(node))
    with NvmlGpuSource() as src:
        read(src, node, 0.0)
        node.inject(1, "ecc")  # one uncorrectable error: a row remapped, reset pending
        node.inject(2, "remap_failure")  # no spare row left
        s = read(src, node, 1.0)
        got = [(g.remapped_rows_correctable_total, g.remapped_rows_uncorrectable_total, g.remapped_rows_pending,
                g.remapped_rows_failure) for g in s]
        assert got == [(0, 0, False, False), (0, 1, True, False), (0, 0, False, True)]
        node.clear(2, "remap_failure")
        assert read(src, node, 2.0)[2].remapped_rows_failure is False


def test_an_a100_has_no_gpm_metrics_and_that_is_not_an_error(install):
    node = SimNode("ampere", "a100", 4, workload="busy")
    lib = install(SimNvmlLib(node))
    with NvmlGpuSource() as src:
        for ts in (0.0, 10.0, 20.0):
            samples = read(src, node, ts)
            assert [[getattr(s, f) for f in GPM_FIELDS] for s in samples] == [[None, None]] * 4
        assert src.reader_errors["tensor_activity"] == 0
        assert lib.gpm_samples_allocated == 0
    # Everything else of the new readings is there on an A100.
    others = [f for f in NEW_FIELDS if f not in GPM_FIELDS]
    assert all(getattr(s, f) is not None for s in samples for f in others)


# Each new NVML call, and the fields it alone fills.
CALLS = {
    "nvmlDeviceGetTotalEnergyConsumption": ("energy_mj_total",),
    "nvmlDeviceGetEncoderUtilization": ("util_enc_pct",),
    "nvmlDeviceGetDecoderUtilization": ("util_dec_pct",),
    "nvmlDeviceGetMemoryInfo_v2": ("mem_reserved_bytes",),
    "nvmlDeviceGetRemappedRows": ("remapped_rows_correctable_total", "remapped_rows_uncorrectable_total", "remapped_rows_pending",
                                  "remapped_rows_failure"),
}


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND])
@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_call_the_gpu_does_not_support_leaves_its_fields_null(install, call, code):
    """Not supported on this GPU (or unknown to this driver): its own fields null, every other
    reading there, no reader error, and the sample is sent."""
    node = SimNode("n", "h100", 2, workload="busy")
    node.gpus[1].call_errors[call] = code
    install(SimNvmlLib(node))
    with NvmlGpuSource() as src:
        read(src, node, 0.0)
        ok, unsupported = read(src, node, 10.0)
        assert sum(src.reader_errors.values()) == 0
    assert not unsupported.lost
    assert all(getattr(unsupported, f) is None for f in CALLS[call])
    for f in NEW_FIELDS:
        assert getattr(ok, f) is not None, f
        if f not in CALLS[call]:
            assert getattr(unsupported, f) is not None, f
    assert unsupported.power_w is not None and unsupported.mem_used_bytes is not None and unsupported.util_gpu_pct is not None


def test_a_gpm_metric_the_gpu_lacks_is_null_alone(install, monkeypatch):
    """Per-metric NOT_SUPPORTED inside a successful nvmlGpmMetricsGet leaves that field null only."""
    import agent.sim.libnvml.gpm as simgpm

    trimmed = {k: v for k, v in simgpm.GPM_METRICS.items() if k != pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL}
    monkeypatch.setattr(simgpm, "GPM_METRICS", trimmed)
    node = SimNode("n", "h100", 1, workload="busy")
    install(SimNvmlLib(node))
    with NvmlGpuSource() as src:
        read(src, node, 0.0)
        (s,) = read(src, node, 10.0)
        assert src.reader_errors["tensor_activity"] == 0
    assert s.dram_active_pct is None
    assert s.gr_engine_active_pct is not None and s.tensor_active_pct is not None
