"""thermal: thermal slowdown bits, or clocks below peers while far hotter than peers."""

from __future__ import annotations

import pytest

from server.detect.model import HW_SLOWDOWN, HW_THERMAL, IDLE, SW_POWER_CAP, SW_THERMAL
from server.detect.rules import thermal
from tests.detect.builders import CFG, Row, check_row, gpu, h100_peers, idle_gpu, one

PEERS = h100_peers()
CAPPED_PEERS = h100_peers(clocks_event_reasons=SW_POWER_CAP)  # a power-bound job's busy GPUs  # clock median 1980 MHz, temperature median 66 °C

ROWS = [
    # --- must flag
    Row("HW thermal bit, clock 29% low, hot: critical", one(gpu(sm_clock_mhz=1410, temp_c=91, clocks_event_reasons=HW_THERMAL | HW_SLOWDOWN)),
        PEERS, "thermal", "critical"),
    Row("HW thermal bit without peers: absolute, critical", one(gpu(sm_clock_mhz=1410, temp_c=91, clocks_event_reasons=HW_THERMAL)),
        None, "thermal", "critical"),
    Row("SW thermal bit, busy, clock 10% low: warning", one(gpu(sm_clock_mhz=1782, temp_c=88, clocks_event_reasons=SW_THERMAL)),
        PEERS, "thermal", "warning"),
    Row("SW thermal bit, busy, clock at peers: still the bit", one(gpu(temp_c=88, clocks_event_reasons=SW_THERMAL)), PEERS, "thermal", "warning"),
    Row("SW thermal bit, clock 30% low: critical", one(gpu(sm_clock_mhz=1386, temp_c=90, clocks_event_reasons=SW_THERMAL)),
        PEERS, "thermal", "critical"),
    Row("SW thermal bit without peers: absolute warning", one(gpu(sm_clock_mhz=1600, temp_c=88, clocks_event_reasons=SW_THERMAL)),
        None, "thermal", "warning"),
    Row("SW thermal + SW power cap bits, clocks low: thermal, not power", one(gpu(sm_clock_mhz=1600, temp_c=88,
                                                                                  clocks_event_reasons=SW_THERMAL | SW_POWER_CAP)),
        PEERS, "thermal", "warning"),
    Row("SW thermal + HW slowdown: thermal, critical (not hw_slowdown)", one(gpu(sm_clock_mhz=1600, temp_c=92,
                                                                                 clocks_event_reasons=SW_THERMAL | HW_SLOWDOWN)),
        PEERS, "thermal", "critical"),
    Row("no bit, clock 10% low, 12 °C hotter than peers", one(gpu(sm_clock_mhz=1782, temp_c=78)), PEERS, "thermal", "warning"),
    Row("no bit, clock 10% low, exactly hot_delta_c hotter", one(gpu(sm_clock_mhz=1782, temp_c=76)), PEERS, "thermal", "warning"),
    Row("no bit but SW power cap, clock low, 15 °C hotter, capped peers: thermal beats power",
        one(gpu(sm_clock_mhz=1700, temp_c=81, clocks_event_reasons=SW_POWER_CAP)), CAPPED_PEERS, "thermal", "warning"),
    Row("SW power cap, clock low, 15 °C hotter than peers below their cap: more work, not heat",
        one(gpu(sm_clock_mhz=1700, temp_c=81, clocks_event_reasons=SW_POWER_CAP)), PEERS, None),
    Row("no bit, clock 30% low and hot: critical", one(gpu(sm_clock_mhz=1380, temp_c=85)), PEERS, "thermal", "critical"),
    Row("HW thermal + HW slowdown on a GPU at 0% (the hardware holds the clock)",
        one(gpu(util_gpu_pct=0, sm_clock_mhz=300, temp_c=95, clocks_event_reasons=HW_THERMAL | HW_SLOWDOWN)), PEERS, "thermal", "critical"),
    Row("the whole group in SW thermal slowdown (room too hot): every GPU really is slowed, so each is flagged",
        one(gpu(temp_c=88, clocks_event_reasons=SW_THERMAL)), h100_peers(temp_shift=22, clocks_event_reasons=SW_THERMAL), "thermal", "warning"),
    # --- must not flag
    Row("hot but clock at peers, no bit", one(gpu(temp_c=85)), PEERS, None),
    Row("9 °C hotter, clock 10% low: below hot_delta_c → clock, not thermal", one(gpu(sm_clock_mhz=1782, temp_c=75)), PEERS, "clock", "warning"),
    Row("SW thermal bit on an idle GPU", one(idle_gpu(clocks_event_reasons=IDLE | SW_THERMAL)), PEERS, None),
    Row("SW thermal bit at 0% utilisation without the Idle bit", one(gpu(util_gpu_pct=0, clocks_event_reasons=SW_THERMAL)), PEERS, None),
    Row("HW thermal bit alone on a GPU at 0% without HW slowdown (nothing held)",
        one(gpu(util_gpu_pct=0, temp_c=40, clocks_event_reasons=HW_THERMAL)), PEERS, None),
    Row("warm afternoon: the whole group 15 °C warmer, this GPU with it", one(gpu(temp_c=81)), h100_peers(temp_shift=15), None),
    Row("hot and clock low without peers: no peer comparison", one(gpu(sm_clock_mhz=1500, temp_c=85)), None, None),
]


@pytest.mark.parametrize("row", ROWS, ids=repr)
def test_thermal_table(row):
    check_row(row)


def test_summary_and_evidence_read_like_the_example():
    f = thermal.evaluate(one(gpu(sm_clock_mhz=1410, temp_c=91, clocks_event_reasons=HW_THERMAL | HW_SLOWDOWN)), PEERS, CFG)
    assert f.summary == "GPU 3 SM clock 1410 MHz vs peer median 1980 MHz (-29%); HW thermal slowdown; 91 °C vs 66 °C"
    ev = f.evidence
    assert ev["metric"] == "sm_clock_mhz" and ev["value"] == 1410 and ev["peer_median"] == 1980
    assert ev["deviation"] == pytest.approx(-0.288, abs=1e-3)
    assert ev["reasons"] == ["HW slowdown", "HW thermal slowdown"]
    assert ev["temp_c"] == 91 and ev["peer_temp_c"] == 66
    assert ev["trigger"] == "hw_thermal_bit"


def test_hot_without_bit_names_the_temperature_gap():
    f = thermal.evaluate(one(gpu(sm_clock_mhz=1782, temp_c=78)), PEERS, CFG)
    assert "no thermal bit, running 12 °C hotter than peers" in f.summary
    assert f.evidence["trigger"] == "clock_below_peers_and_hot"
