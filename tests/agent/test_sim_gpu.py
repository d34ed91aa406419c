"""The GPU simulator: realistic baselines, faults as the agent sees them, time, threads."""

from __future__ import annotations

import threading

import pynvml
import pytest

from agent.nvml.source import NvmlGpuSource
from agent.sim.faults import FaultSpec, parse_fault_spec
from agent.sim.gpu import SimNode
from agent.sim.libnvml import SimNvmlLib

IDLE = pynvml.nvmlClocksEventReasonGpuIdle
SW_POWER_CAP = pynvml.nvmlClocksEventReasonSwPowerCap
HW_SLOWDOWN = pynvml.nvmlClocksEventReasonHwSlowdown
SW_THERMAL = pynvml.nvmlClocksEventReasonSwThermalSlowdown
HW_THERMAL = pynvml.nvmlClocksEventReasonHwThermalSlowdown
POWER_BRAKE = pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown


def read_node(install, node: SimNode, times=(0.0,)):
    """Samples of every time in `times` (node advanced to each), through real pynvml."""
    install(SimNvmlLib(node))
    out = []
    with NvmlGpuSource() as src:
        for ts in times:
            node.advance(ts)
            out.append(src.read(ts))
    return out


def peers(samples, skip):
    return [s for s in samples if s.index != skip]


def test_busy_h100_node_looks_like_training(install):
    node = SimNode("busy", "h100", 8, workload="busy", seed=3)
    rounds = read_node(install, node, times=[float(t) for t in range(0, 100, 10)])
    capped = 0
    for samples in rounds:
        for s in samples:
            assert 90 <= s.util_gpu_pct <= 100
            assert 0.85 * 1980 <= s.sm_clock_mhz <= 1980
            assert 0.85 * 700 <= s.power_w <= 700
            assert 55 <= s.temp_c <= 80 and s.mem_temp_c > s.temp_c
            assert s.clocks_event_reasons & ~SW_POWER_CAP == 0
            assert (s.pcie_gen, s.pcie_width) == (5, 16)
            assert s.mem_used_bytes > 0.8 * s.mem_total_bytes
            capped += bool(s.clocks_event_reasons & SW_POWER_CAP)
    # near the cap some GPUs are held by SW power cap, not all of them all the time
    assert 0 < capped < 80


def test_idle_node_matches_the_real_idle_h100_dump(install):
    (samples,) = read_node(install, SimNode("idle", "h100", 8, workload="idle", seed=3))
    for s in samples:
        assert s.clocks_event_reasons == IDLE
        assert s.sm_clock_mhz == 345 and s.mem_clock_mhz == 2619
        assert 60 <= s.power_w <= 80
        assert s.util_gpu_pct == 0
        assert 28 <= s.temp_c <= 42
        assert s.pcie_gen == 5  # H100 keeps gen5 when idle (realdata)


def test_idle_consumer_card_steps_pcie_down_to_gen1(install):
    (samples,) = read_node(install, SimNode("idle", "rtx4090", 2, workload="idle"))
    assert all(s.pcie_gen == 1 and s.pcie_gen_max == 4 and s.sm_clock_mhz == 210 for s in samples)


@pytest.mark.parametrize(
    "model,sm,mem,limit,links,gen,total_gib",
    [("h100", 1980, 2619, 700, 18, 5, 79.6), ("h200", 1980, 3201, 700, 18, 5, 140.4), ("a100", 1410, 1593, 400, 12, 4, 80.0)],
)
def test_models(install, model, sm, mem, limit, links, gen, total_gib):
    (samples,) = read_node(install, SimNode("m", model, 1))
    s = samples[0]
    assert (s.sm_clock_max_mhz, s.mem_clock_max_mhz, s.power_limit_w) == (sm, mem, limit)
    assert (s.nvlink_links_total, s.pcie_gen_max, s.pcie_width_max) == (links, gen, 16)
    assert s.mem_total_bytes / 2**30 == pytest.approx(total_gib, abs=0.1)


def test_same_seed_same_readings(install):
    a = read_node(install, SimNode("n", "h100", 4, seed=11), times=(0.0, 5.0))
    b = read_node(install, SimNode("n", "h100", 4, seed=11), times=(0.0, 5.0))
    c = read_node(install, SimNode("n", "h100", 4, seed=12), times=(0.0, 5.0))
    def strip(rounds):
        return [[(s.power_w, s.sm_clock_mhz, s.temp_c, s.nvlink_tx_bytes_total) for s in r] for r in rounds]

    assert strip(a) == strip(b)
    assert strip(a) != strip(c)


def test_thermal_fault(install):
    node = SimNode("n", "h100", 8, seed=1)
    node.inject(3, "thermal")
    (samples,) = read_node(install, node)
    hot = samples[3]
    assert hot.clocks_event_reasons & (SW_THERMAL | HW_THERMAL) == SW_THERMAL | HW_THERMAL
    assert hot.temp_c >= 88
    assert hot.sm_clock_mhz < 0.6 * min(p.sm_clock_mhz for p in peers(samples, 3))
    assert all(p.clocks_event_reasons & (SW_THERMAL | HW_THERMAL) == 0 for p in peers(samples, 3))


def test_sw_thermal_only_level(install):
    node = SimNode("n", "h100", 2)
    node.apply("gpu0:thermal=1")
    (samples,) = read_node(install, node)
    assert samples[0].clocks_event_reasons & SW_THERMAL
    assert not samples[0].clocks_event_reasons & (HW_THERMAL | HW_SLOWDOWN)


def test_power_brake_fault(install):
    node = SimNode("n", "h100", 8)
    node.inject(2, "power_brake")
    (samples,) = read_node(install, node)
    s = samples[2]
    assert s.clocks_event_reasons & (HW_SLOWDOWN | POWER_BRAKE) == HW_SLOWDOWN | POWER_BRAKE
    assert s.sm_clock_mhz < 200  # real braked H100s sat at 86 MHz
    assert s.power_w < 150


def test_low_power_cap_fault(install):
    node = SimNode("n", "h100", 8)
    node.inject(6, "low_power_cap", 400)
    (samples,) = read_node(install, node)
    s = samples[6]
    assert s.power_limit_w == 400 and s.power_w <= 400
    assert s.clocks_event_reasons & SW_POWER_CAP
    assert s.sm_clock_mhz < 0.8 * min(p.sm_clock_mhz for p in peers(samples, 6))
    assert all(p.power_limit_w == 700 for p in peers(samples, 6))


def test_hw_slowdown_and_silent_clocks_stuck_low(install):
    node = SimNode("n", "h100", 8)
    node.inject(0, "hw_slowdown")
    node.inject(1, "clocks_stuck_low")
    (samples,) = read_node(install, node)
    assert samples[0].clocks_event_reasons & HW_SLOWDOWN
    assert samples[0].sm_clock_mhz <= 1000
    stuck = samples[1]
    assert stuck.clocks_event_reasons == 0  # no reason bit: only peer comparison catches it
    assert stuck.sm_clock_mhz <= 0.6 * 1980
    assert stuck.util_gpu_pct >= 90


def test_nvlink_faults(install):
    node = SimNode("n", "h100", 8)
    node.inject(4, "nvlink_down", 2)
    node.inject(5, "nvlink_errors", 50)
    first, later = read_node(install, node, times=(0.0, 10.0))
    assert (later[4].nvlink_links_up, later[4].nvlink_links_total) == (16, 18)
    assert later[4].nvlink_recovery_errors_total >= 2
    assert later[5].nvlink_crc_errors_total - first[5].nvlink_crc_errors_total == pytest.approx(500, abs=2)
    assert later[5].nvlink_replay_errors_total > first[5].nvlink_replay_errors_total
    healthy = later[0]
    assert healthy.nvlink_links_up == 18 and healthy.nvlink_crc_errors_total == 0
    # fewer links, less traffic
    def moved(i):
        return later[i].nvlink_tx_bytes_total - first[i].nvlink_tx_bytes_total

    assert moved(4) < moved(0) * 0.95


def test_pcie_faults(install):
    node = SimNode("n", "h100", 8)
    node.inject(1, "pcie_downtrained")
    node.inject(2, "pcie_replays", 4)
    first, later = read_node(install, node, times=(0.0, 30.0))
    assert (later[1].pcie_gen, later[1].pcie_width) == (3, 8)
    assert (later[1].pcie_gen_max, later[1].pcie_width_max) == (5, 16)
    assert later[2].pcie_replay_total - first[2].pcie_replay_total == pytest.approx(120, abs=1)
    assert later[3].pcie_replay_total == first[3].pcie_replay_total


def test_ecc_fault_and_clear(install):
    node = SimNode("n", "a100", 4)
    lib = install(SimNvmlLib(node))
    with NvmlGpuSource() as src:
        node.inject(2, "ecc", 2)
        node.advance(10.0)
        s = src.read(10.0)[2]
        assert s.ecc_uncorrected_total == 2 and s.remapped_rows_pending is True
        assert src.read(10.0)[1].ecc_uncorrected_total == 0
        node.clear(2, "ecc")
        node.advance(20.0)
        s = src.read(20.0)[2]
        assert s.remapped_rows_pending is False
        assert s.ecc_uncorrected_total == 2  # aggregate counts do not go back
    assert lib.init_count(node) == 0


def test_clear_restores_the_gpu(install):
    node = SimNode("n", "h100", 2)
    node.inject(0, "thermal")
    node.clear(0)
    (samples,) = read_node(install, node)
    assert samples[0].clocks_event_reasons & (SW_THERMAL | HW_THERMAL) == 0
    assert node.active_faults() == {}


def test_lost_gpu_is_frozen(install):
    node = SimNode("n", "h100", 2)
    node.inject(1, "lost")
    before = node.gpus[1].counters.nvlink_tx_bytes
    node.advance(0.0)
    node.advance(100.0)
    assert node.gpus[1].counters.nvlink_tx_bytes == before
    assert node.gpus[0].counters.nvlink_tx_bytes > before


def test_time_going_backwards_is_ignored():
    node = SimNode("n", "h100", 1)
    node.advance(10.0)
    tx = node.gpus[0].counters.nvlink_tx_bytes
    node.advance(5.0)
    assert node.gpus[0].counters.nvlink_tx_bytes == tx and node.last_ts == 10.0


@pytest.mark.parametrize(
    "text,spec",
    [
        ("gpu3:thermal", FaultSpec(3, "thermal")),
        ("3:xid=79", FaultSpec(3, "xid", 79)),
        ("*:power_brake", FaultSpec(None, "power_brake")),
        ("all:pcie_replays=0.5", FaultSpec(None, "pcie_replays", 0.5)),
        ("node-02/gpu1:nvlink_down=2", FaultSpec(1, "nvlink_down", 2, node="node-02")),
    ],
)
def test_parse_fault_spec(text, spec):
    assert parse_fault_spec(text) == spec


@pytest.mark.parametrize("text", ["gpu3", "gpu3:melted", "x:thermal", "3:xid=abc", ""])
def test_parse_fault_spec_rejects(text):
    with pytest.raises(ValueError):
        parse_fault_spec(text)


def test_faults_from_specs_at_construction():
    node = SimNode("n", "h100", 4, faults=["gpu1:thermal", "*:pcie_replays=1"])
    faults = node.active_faults()
    assert [f.name for f in faults[1]] == ["thermal", "pcie_replays"]
    assert [f.name for f in faults[0]] == ["pcie_replays"]


def test_init_and_shutdown_are_refcounted_across_threads(install):
    lib = install(SimNvmlLib())
    node = SimNode("n", "h100", 2)
    errors: list[BaseException] = []

    def churn() -> None:
        try:
            for _ in range(20):
                with lib.node(node):
                    pynvml.nvmlInit()
                    assert pynvml.nvmlDeviceGetCount() == 2
                    pynvml.nvmlShutdown()
        except BaseException as err:
            errors.append(err)

    with lib.node(node):
        pynvml.nvmlInit()  # held open throughout: others' shutdowns must not close it
        threads = [threading.Thread(target=churn) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert not errors
        assert lib.init_count(node) == 1
        assert pynvml.nvmlDeviceGetCount() == 2
        pynvml.nvmlShutdown()
    assert lib.init_count(node) == 0
