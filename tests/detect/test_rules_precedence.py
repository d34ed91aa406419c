"""One fault, one cause: the precedence between the performance causes, the hand-offs between
the event rules, the must-not-flag situations across all rules, and real snapshots from
/work/shared/realdata (values copied here so the tests stand alone)."""

from __future__ import annotations

import itertools

import pytest

from server.detect import rules
from server.detect.model import (
    APP_CLOCKS,
    HW_POWER_BRAKE,
    HW_SLOWDOWN,
    HW_THERMAL,
    IDLE,
    SW_POWER_CAP,
    SW_THERMAL,
    SYNC_BOOST,
    GpuObs,
)
from server.detect.rules import clock, ecc, hw_slowdown, lost, network, nvlink, pcie, power, thermal, xid
from tests.detect.builders import CFG, Row, check_row, gpu, group, h100_peers, idle_gpu, judge_gpu, one, peers_of, series

PEERS = h100_peers()
CAPPED_PEERS = h100_peers(clocks_event_reasons=SW_POWER_CAP)  # a power-bound job's busy GPUs
PERF = {"thermal", "power", "hw_slowdown", "clock"}


def test_rule_lists_are_explicit_and_ordered():
    assert rules.GPU_RULES == [lost.evaluate, xid.evaluate, ecc.evaluate, thermal.evaluate, power.evaluate,
                               hw_slowdown.evaluate, clock.evaluate, nvlink.evaluate, pcie.evaluate]
    assert rules.NIC_RULES == [network.evaluate]


ROWS = [
    # The precedence examples.
    Row("thermally throttled: thermal bits, clock low, hot → thermal only",
        one(gpu(sm_clock_mhz=1400, temp_c=90, clocks_event_reasons=SW_THERMAL | SW_POWER_CAP)), PEERS, "thermal", "critical"),
    Row("low power cap with SW power cap bit and clock low → power", one(gpu(power_limit_w=450, sm_clock_mhz=1700,
                                                                             clocks_event_reasons=SW_POWER_CAP)),
        PEERS, "power", "warning"),
    Row("clock low, no explanatory bit, not hotter → clock", one(gpu(sm_clock_mhz=1700)), PEERS, "clock", "warning"),
    # Order between the bits.
    Row("HW thermal + HW power brake + HW slowdown → thermal",
        one(gpu(sm_clock_mhz=800, temp_c=95, clocks_event_reasons=HW_THERMAL | HW_POWER_BRAKE | HW_SLOWDOWN)),
        PEERS, "thermal", "critical"),
    Row("HW power brake + SW thermal → power", one(gpu(sm_clock_mhz=800, clocks_event_reasons=HW_POWER_BRAKE | HW_SLOWDOWN | SW_THERMAL)),
        PEERS, "power", "critical"),
    Row("SW thermal + HW slowdown → thermal", one(gpu(sm_clock_mhz=1000, temp_c=92, clocks_event_reasons=SW_THERMAL | HW_SLOWDOWN)),
        PEERS, "thermal", "critical"),
    Row("HW slowdown + SW power cap + power limit low → hw_slowdown",
        one(gpu(sm_clock_mhz=1000, power_limit_w=400, clocks_event_reasons=HW_SLOWDOWN | SW_POWER_CAP)),
        PEERS, "hw_slowdown", "critical"),
    Row("power limit low + hot + clock low → power (the limit is a fact, heat a correlation)",
        one(gpu(power_limit_w=450, sm_clock_mhz=1700, temp_c=80)), PEERS, "power", "warning"),
    Row("clock low + hot + SW power cap, capped peers → thermal", one(gpu(sm_clock_mhz=1700, temp_c=80, clocks_event_reasons=SW_POWER_CAP)),
        CAPPED_PEERS, "thermal", "warning"),
    Row("clock low + applications clocks bit → clock", one(gpu(sm_clock_mhz=1700, clocks_event_reasons=APP_CLOCKS)), PEERS, "clock", "warning"),
    # Event hand-offs.
    Row("lost + hardware XID → lost", one(gpu(lost=True, xids=(79,))), PEERS, "lost", "critical"),
    Row("new uncorrected ECC + XID 94 → ecc", one(gpu(ecc_uncorrected_new=1, xids=(94,))), PEERS, "ecc", "critical", immediate=True),
    # Must not flag, across every rule.
    Row("healthy busy H100", one(gpu()), PEERS, None),
    Row("healthy busy H100 with the routine SW power cap bit", one(gpu(clocks_event_reasons=SW_POWER_CAP)), PEERS, None),
    Row("healthy busy H100 without peers", one(gpu(clocks_event_reasons=SW_POWER_CAP)), None, None),
    Row("idle H100 (Idle bit, 345 MHz, Gen3 link, no NVLink traffic)", one(idle_gpu(pcie_gen=3)), PEERS, None),
    Row("checkpoint: whole job idle, so no peers", one(idle_gpu()), peers_of(group(util_gpu_pct=0, clocks_event_reasons=IDLE, sm_clock_mhz=345)),
        None),
    Row("warm afternoon + comms phase: whole group hotter, lower power and NVLink-heavy",
        one(gpu(temp_c=80, power_w=350, nvlink_bps=300e9)), h100_peers(temp_shift=14, power_w=350, nvlink_scale=2.0), None),
    Row("one noisy sample in the past does not matter, the latest is healthy", series(5, at={2: {"sm_clock_mhz": 1000}}), PEERS, None),
]


@pytest.mark.parametrize("row", ROWS, ids=repr)
def test_precedence_table(row):
    check_row(row)


BITS = (HW_THERMAL, HW_POWER_BRAKE, HW_SLOWDOWN, SW_THERMAL, SW_POWER_CAP, APP_CLOCKS, SYNC_BOOST, IDLE)


def _combos():
    for n in range(len(BITS) + 1):
        for subset in itertools.combinations(BITS, n):
            yield sum(subset)


@pytest.mark.parametrize("util", [0.0, 95.0])
@pytest.mark.parametrize("with_peers", [True, False])
def test_never_two_performance_causes(util, with_peers):
    """Every combination of reason bits × clock low or not × hot or not × power limit low or not
    gives at most one of thermal/power/hw_slowdown/clock."""
    peers = PEERS if with_peers else None
    for bits, clock_mhz, temp, limit in itertools.product(_combos(), (1980, 1700, 1300), (66, 85), (700, 450)):
        obs = gpu(util_gpu_pct=util, clocks_event_reasons=bits, sm_clock_mhz=clock_mhz, temp_c=temp, power_limit_w=limit)
        causes = [f.cause for f in judge_gpu(one(obs), peers, CFG)]
        perf = [c for c in causes if c in PERF]
        assert len(perf) <= 1, (bits, clock_mhz, temp, limit, causes)
        if not (util and with_peers) and not bits & (HW_THERMAL | HW_POWER_BRAKE | HW_SLOWDOWN | SW_THERMAL):
            assert perf == [], (bits, clock_mhz, temp, limit, causes)  # without busy peers only the bits speak


# --- real snapshots (/work/shared/realdata, gpud nvidia-smi -q dumps and superbench gpu-burn) ---


def _h100(i: int, **kw) -> GpuObs:
    return gpu(index=i, uuid=f"GPU-real-{i}", **kw)


def test_realdata_node_wide_power_brake_is_power_on_every_gpu():
    # gpud 535.161.08.out.0: 8× H100, HW Slowdown + HW Power Brake, SM 86/1980 MHz, 67-72 W, 29-32 °C, 0 %.
    temps, watts = (29, 29, 30, 30, 31, 32, 32, 31), (67.74, 69.52, 70.55, 71.37, 70.33, 70.21, 71.05, 72.27)
    node = [_h100(i, util_gpu_pct=0.0, sm_clock_mhz=86, temp_c=temps[i], power_w=watts[i], clocks_event_reasons=HW_SLOWDOWN | HW_POWER_BRAKE)
            for i in range(8)]
    peers = peers_of(node)
    assert peers is None  # no busy member: a within-node comparison sees nothing
    for obs in node:
        found = judge_gpu(one(obs), peers, CFG)
        assert [(f.cause, f.severity) for f in found] == [("power", "critical")]


def test_realdata_single_gpu_reason_outlier_among_idle_peers_is_not_judged():
    # gpud 535.183.01.out.0: 7 idle H100s (Idle, 345 MHz) and GPU 75:00.0 with SW Power Cap + HW Power
    # Brake + SW Thermal at 1980 MHz, 118 W, 39 °C, 0 % util. Nothing is slowed and nothing is busy.
    node = [_h100(i, util_gpu_pct=0.0, sm_clock_mhz=345, temp_c=36 + i % 3, power_w=70.0, clocks_event_reasons=IDLE) for i in range(7)]
    node.append(_h100(7, util_gpu_pct=0.0, sm_clock_mhz=1980, temp_c=39, power_w=118.01,
                      clocks_event_reasons=SW_POWER_CAP | HW_POWER_BRAKE | SW_THERMAL))
    peers = peers_of(node)
    for obs in node:
        assert judge_gpu(one(obs), peers, CFG) == []


RTX4090 = dict(model="NVIDIA GeForce RTX 4090", sm_clock_max_mhz=3105, power_limit_w=450.0, pcie_gen_max=4, pcie_gen=4,
               nvlink_links_up=None, nvlink_links_total=None, nvlink_bps=None)


def test_realdata_busy_rtx4090s_with_and_without_power_cap_are_all_fine():
    # The six busy RTX 4090 readings of one node across gpud out.0/out.1/out.2 (MHz, W, °C, util, SW power cap):
    # a real spread of busy clocks (2520-2775 MHz, ±5 %) that clock_drop must not flag.
    readings = [(2640, 445.38, 72, 97, True), (2520, 446.36, 76, 100, True), (2640, 405.59, 74, 100, False),
                (2730, 435.24, 74, 96, True), (2775, 157.70, 58, 100, False), (2685, 313.42, 62, 91, False)]
    node = [gpu(index=i, uuid=f"GPU-4090-{i}", sm_clock_mhz=c, power_w=w, temp_c=t, util_gpu_pct=u,
                clocks_event_reasons=SW_POWER_CAP if cap else 0, **RTX4090) for i, (c, w, t, u, cap) in enumerate(readings)]
    peers = peers_of(node)
    assert peers is not None and peers.size == 6
    for obs in node:
        assert judge_gpu(one(obs), peers, CFG) == [], obs


def test_realdata_idle_rtx4090s_at_gen1_are_fine():
    # gpud out.3 / 4090 dumps: P8, Idle, 210 MHz, PCIe Gen1 of Gen4, x16.
    obs = gpu(util_gpu_pct=0.0, sm_clock_mhz=210, clocks_event_reasons=IDLE, power_w=17.0, temp_c=31, **{**RTX4090, "pcie_gen": 1})
    assert judge_gpu(one(obs), None, CFG) == []


def test_realdata_gpu_burn_a100_temperatures_are_within_normal_spread():
    # superbench gpu_burn_8xA100.log, final line: 58-62 °C under identical load, all OK.
    temps = (62, 59, 58, 60, 60, 59, 58, 61)
    node = [gpu(index=i, uuid=f"GPU-a100-{i}", model="NVIDIA A100-SXM4-80GB", sm_clock_mhz=1410, sm_clock_max_mhz=1410,
                power_limit_w=400.0, temp_c=t, nvlink_links_total=12, nvlink_links_up=12, pcie_gen_max=4, pcie_gen=4)
            for i, t in enumerate(temps)]
    peers = peers_of(node)
    for obs in node:
        assert judge_gpu(one(obs), peers, CFG) == []
