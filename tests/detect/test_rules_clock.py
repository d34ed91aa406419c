"""clock: SM clock well below the busy peers' with nothing to explain it. Needs peers."""

from __future__ import annotations

import pytest

from server.detect.model import APP_CLOCKS, IDLE, SW_POWER_CAP, SYNC_BOOST, PeerStats, Robust
from server.detect.rules import clock
from tests.detect.builders import CFG, Row, check_row, gpu, group, h100_peers, idle_gpu, one, peers_of, tweak

PEERS = h100_peers()  # median 1980 MHz; MAD 0 → the 1% noise floor applies

# A group whose clocks spread widely (±10%): a 9% drop is within its own noise (z > -4).
WIDE = PeerStats(group="g", size=8, sm_clock_ratio=Robust(median=1.0, mad=0.1, n=8), sm_clock_max_mhz=Robust(1980, 0, 8),
                 temp_c=Robust(66, 2, 8), power_w=Robust(660, 10, 8), power_limit_w=Robust(700, 0, 8), nvlink_bps=Robust(150e9, 1e9, 8))

ROWS = [
    # --- must flag
    Row("clock 9% below peers, nothing explains it", one(gpu(sm_clock_mhz=1802)), PEERS, "clock", "warning"),
    Row("clock 24% below: still a warning", one(gpu(sm_clock_mhz=1505)), PEERS, "clock", "warning"),
    Row("clock 26% below: critical", one(gpu(sm_clock_mhz=1465)), PEERS, "clock", "critical"),
    Row("clock low, 9 °C hotter (under hot_delta_c)", one(gpu(sm_clock_mhz=1700, temp_c=75)), PEERS, "clock", "warning"),
    Row("clock low with only the applications-clocks bit", one(gpu(sm_clock_mhz=1600, clocks_event_reasons=APP_CLOCKS)), PEERS, "clock", "warning"),
    Row("clock low with only sync boost", one(gpu(sm_clock_mhz=1600, clocks_event_reasons=SYNC_BOOST)), PEERS, "clock", "warning"),
    Row("max clock capped at 1600 MHz and running at it (ratio 1.0 of its own max)",
        one(gpu(sm_clock_mhz=1600, sm_clock_max_mhz=1600)), PEERS, "clock", "warning"),
    Row("silent straggler: cool, low power, clock low", one(gpu(sm_clock_mhz=1700, temp_c=55, power_w=450)), PEERS, "clock", "warning"),
    # --- must not flag
    Row("clock 7% below peers (under clock_drop)", one(gpu(sm_clock_mhz=1841)), PEERS, None),
    Row("clock 9% below in a wide group (z above -clock_z)", one(gpu(sm_clock_mhz=1802)), WIDE, None),
    Row("no peers: no clock judgement", one(gpu(sm_clock_mhz=1000)), None, None),
    Row("group too small: peers None", one(gpu(sm_clock_mhz=1000)), peers_of(group(2)), None),
    Row("idle GPU at 345 MHz with busy peers", one(idle_gpu()), PEERS, None),
    Row("0% utilisation without the Idle bit (context held, no work)", one(gpu(util_gpu_pct=0, sm_clock_mhz=1600)), PEERS, None),
    Row("util unreadable", one(gpu(util_gpu_pct=None, sm_clock_mhz=1000)), PEERS, None),
    Row("checkpoint pause: every GPU idle, so no busy peers", one(idle_gpu()), peers_of(group(util_gpu_pct=0, clocks_event_reasons=IDLE,
                                                                                              sm_clock_mhz=345)), None),
    Row("whole group slowed together by 20%", one(gpu(sm_clock_mhz=1584)), h100_peers(clock_scale=0.8), None),
    Row("faster than peers", one(gpu(sm_clock_mhz=1980)), h100_peers(clock_scale=0.9), None),
    Row("clock unreadable", one(gpu(sm_clock_mhz=None)), PEERS, None),
    Row("a larger clock_drop setting spares a 9% drop", one(gpu(sm_clock_mhz=1802)), PEERS, None, cfg=tweak(clock_drop=0.1)),
]


@pytest.mark.parametrize("row", ROWS, ids=repr)
def test_clock_table(row):
    check_row(row)


def test_summary_and_evidence():
    f = clock.evaluate(one(gpu(sm_clock_mhz=1700)), PEERS, CFG)
    assert f.summary == "GPU 3 SM clock 1700 MHz vs peer median 1980 MHz (-14%); no clock-event reason explains it; 66 °C vs 66 °C"
    ev = f.evidence
    assert (ev["metric"], ev["value"], ev["peer_median"]) == ("sm_clock_mhz", 1700, 1980)
    assert ev["deviation"] == pytest.approx(-0.141, abs=1e-3)
    assert ev["clock_z"] < -CFG.clock_z
    assert ev["reasons"] == [] and ev["trigger"] == "clock_below_peers_unexplained"


def test_summary_names_bits_that_do_not_explain():
    f = clock.evaluate(one(gpu(sm_clock_mhz=1600, clocks_event_reasons=APP_CLOCKS)), PEERS, CFG)
    assert "only applications clocks setting active" in f.summary


def test_sw_power_cap_is_the_explanation_not_clock():
    assert clock.evaluate(one(gpu(sm_clock_mhz=1600, clocks_event_reasons=SW_POWER_CAP)), PEERS, CFG) is None


def test_a_gpu_that_reports_no_reasons_is_said_to_not_to_have_none():
    """Found by a probe that dropped clocks_event_reasons from half the nodes (a driver or vGPU
    answering NOT_SUPPORTED): their power-braked and slowed-down GPUs were reported as
    "no clock-event reason explains it", which the numbers did not say."""
    f = clock.evaluate(one(gpu(sm_clock_mhz=1600, clocks_event_reasons=None)), PEERS, CFG)
    assert "clock-event reasons not reported" in f.summary and "no clock-event reason" not in f.summary


def test_a_clock_without_reasons_is_no_free_clock():
    """The free clock (compared across nodes) is a clock nothing holds down: without the reasons
    there is no telling, e.g. a GPU on its power cap."""
    assert gpu(clocks_event_reasons=0).free_clock == pytest.approx(1.0)
    assert gpu(clocks_event_reasons=None).free_clock is None
    assert gpu(clocks_event_reasons=SW_POWER_CAP).free_clock is None
