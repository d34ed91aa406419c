"""power: HW power brake, an enforced power limit below the peers', or the SW power cap holding
a GPU's clock below its peers'. The SW power cap bit alone is routine."""

from __future__ import annotations

import pytest

from server.detect.model import HW_POWER_BRAKE, HW_SLOWDOWN, IDLE, SW_POWER_CAP, SW_THERMAL
from server.detect.rules import power
from tests.detect.builders import CFG, Row, check_row, gpu, group, h100_peers, idle_gpu, one, peers_of

PEERS = h100_peers()  # clock median 1980 MHz, power limit 700 W
CAPPED_PEERS = h100_peers(clocks_event_reasons=SW_POWER_CAP)  # every busy GPU at its cap, as in the 4090 dumps
HALF_CAPPED_PEERS = peers_of(group(clocks_event_reasons=0)[:4] + group(clocks_event_reasons=SW_POWER_CAP)[4:])

ROWS = [
    # --- must flag
    Row("HW power brake on a busy GPU: critical", one(gpu(sm_clock_mhz=900, power_w=300, clocks_event_reasons=HW_POWER_BRAKE | HW_SLOWDOWN)),
        PEERS, "power", "critical"),
    Row("HW power brake without peers", one(gpu(sm_clock_mhz=900, clocks_event_reasons=HW_POWER_BRAKE | HW_SLOWDOWN)), None, "power", "critical"),
    Row("HW power brake bit alone (no HW slowdown) while busy", one(gpu(clocks_event_reasons=HW_POWER_BRAKE)), PEERS, "power", "critical"),
    Row("realdata node-wide brake: HW slowdown + power brake, 86 of 1980 MHz, 0% util",
        one(gpu(util_gpu_pct=0, sm_clock_mhz=86, power_w=70, temp_c=30, clocks_event_reasons=HW_SLOWDOWN | HW_POWER_BRAKE)),
        None, "power", "critical"),
    Row("HW power brake + SW thermal: the brake (hardware) wins",
        one(gpu(sm_clock_mhz=900, temp_c=88, clocks_event_reasons=HW_POWER_BRAKE | HW_SLOWDOWN | SW_THERMAL)),
        PEERS, "power", "critical"),
    Row("power limit 500 W vs peers 700 W, clocks still at peers: warning", one(gpu(power_limit_w=500)), PEERS, "power", "warning"),
    Row("power limit 6% below peers (658 W)", one(gpu(power_limit_w=658)), PEERS, "power", "warning"),
    Row("power limit low and clock 30% low: critical", one(gpu(power_limit_w=400, sm_clock_mhz=1380, clocks_event_reasons=SW_POWER_CAP)),
        PEERS, "power", "critical"),
    Row("SW power cap, clock 10% low among capped peers", one(gpu(sm_clock_mhz=1782, clocks_event_reasons=SW_POWER_CAP)), CAPPED_PEERS, "power",
        "warning"),
    Row("SW power cap, clock 26% low among capped peers: critical", one(gpu(sm_clock_mhz=1465, clocks_event_reasons=SW_POWER_CAP)),
        CAPPED_PEERS, "power", "critical"),
    Row("SW power cap, clock 10% low, exactly half the peers capped", one(gpu(sm_clock_mhz=1782, clocks_event_reasons=SW_POWER_CAP)),
        HALF_CAPPED_PEERS, "power", "warning"),
    # --- must not flag
    Row("routine SW power cap bit, clock at peers", one(gpu(clocks_event_reasons=SW_POWER_CAP, power_w=698)), CAPPED_PEERS, None),
    Row("SW power cap bit, clock 7% low (below clock_drop)", one(gpu(sm_clock_mhz=1841, clocks_event_reasons=SW_POWER_CAP)), PEERS, None),
    Row("SW power cap bit without peers", one(gpu(sm_clock_mhz=1500, clocks_event_reasons=SW_POWER_CAP)), None, None),
    # GPUs that share a label but not their work (bench/fleetgen/serving.py): the busiest on the
    # cap at a lower clock, its peers below their cap at full clock.
    Row("SW power cap, clock 10% below peers that run below their cap", one(gpu(sm_clock_mhz=1782, clocks_event_reasons=SW_POWER_CAP)),
        PEERS, None),
    Row("SW power cap, clock 26% below peers that run below their cap", one(gpu(sm_clock_mhz=1465, clocks_event_reasons=SW_POWER_CAP)),
        PEERS, None),
    Row("SW power cap, clock 10% low, 3 of 8 peers capped", one(gpu(sm_clock_mhz=1782, clocks_event_reasons=SW_POWER_CAP)),
        peers_of(group(clocks_event_reasons=0)[:5] + group(clocks_event_reasons=SW_POWER_CAP)[5:]), None),
    Row("power limit 4% below peers (672 W)", one(gpu(power_limit_w=672)), PEERS, None),
    Row("power limit low on an idle GPU", one(idle_gpu(power_limit_w=400)), PEERS, None),
    Row("comms phase: the whole group at 300 W, this GPU too", one(gpu(power_w=300, sm_clock_mhz=1980)),
        peers_of(group(power_w=300)), None),
    Row("realdata GPU 75:00.0: SW cap + HW brake + SW thermal bits at 0% util, 1980 MHz, no HW slowdown",
        one(gpu(util_gpu_pct=0, sm_clock_mhz=1980, power_w=118, temp_c=39, clocks_event_reasons=SW_POWER_CAP | HW_POWER_BRAKE | SW_THERMAL)),
        None, None),
    Row("HW power brake bit on an Idle-flagged GPU without HW slowdown", one(idle_gpu(clocks_event_reasons=IDLE | HW_POWER_BRAKE)), PEERS, None),
]


@pytest.mark.parametrize("row", ROWS, ids=repr)
def test_power_table(row):
    check_row(row)


def test_power_limit_finding_reports_the_limit():
    f = power.evaluate(one(gpu(power_limit_w=500)), PEERS, CFG)
    assert f.summary == "GPU 3 SM clock 1980 MHz vs peer median 1980 MHz (+0%); power limit 500 W vs peer median 700 W (-29%); 66 °C vs 66 °C"
    assert f.evidence["metric"] == "power_limit_w"
    assert (f.evidence["value"], f.evidence["peer_median"]) == (500, 700)
    assert f.evidence["deviation"] == pytest.approx(-0.286, abs=1e-3)


def test_sw_power_cap_finding_names_the_bit_and_the_draw():
    f = power.evaluate(one(gpu(sm_clock_mhz=1782, clocks_event_reasons=SW_POWER_CAP, power_w=699)), CAPPED_PEERS, CFG)
    assert f.summary.startswith("GPU 3 SM clock 1782 MHz vs peer median 1980 MHz (-10%); SW power cap")
    assert "drawing 699 W of 700 W limit" in f.summary
    assert f.evidence["trigger"] == "clock_below_peers_and_sw_power_cap"
    # Chronic where it is a fault, fleeting where the GPUs' work differs: it waits.
    assert f.open_after_s == CFG.power_capped_open_after_s > CFG.open_after_s


def test_only_a_capped_clock_waits_longer_to_open():
    limit = power.evaluate(one(gpu(power_limit_w=500)), PEERS, CFG)
    brake = power.evaluate(one(gpu(sm_clock_mhz=900, clocks_event_reasons=HW_POWER_BRAKE | HW_SLOWDOWN)), PEERS, CFG)
    assert limit.open_after_s is None and brake.open_after_s is None


def test_node_wide_brake_summary_says_the_gpu_is_not_busy():
    obs = gpu(util_gpu_pct=0, sm_clock_mhz=86, power_w=70, temp_c=30, clocks_event_reasons=HW_SLOWDOWN | HW_POWER_BRAKE)
    f = power.evaluate(one(obs), None, CFG)
    assert f.summary == "GPU 3 SM clock 86 of max 1980 MHz; HW power brake; 30 °C; drawing 70 W of 700 W limit; at 0% utilisation"


def test_without_reasons_the_power_cap_is_read_from_the_draw():
    """A GPU whose driver reports no clock-event reasons, drawing 99% of its limit at a lower
    clock beside peers at full clock and well below theirs, is the busiest of GPUs doing
    different work (a probe dropping the reasons of serving nodes: 30-36 false clock episodes
    an hour), not an unexplained slow clock."""
    uncapped = group(clocks_event_reasons=None, power_w=450.0)
    busiest = gpu(sm_clock_mhz=1782, power_w=695.0, clocks_event_reasons=None)
    assert busiest.reasons == SW_POWER_CAP and uncapped[0].reasons == 0
    assert check_row(Row("no reasons, on the cap by its draw, peers below theirs", one(busiest), peers_of(uncapped + [busiest]), None)) is None
    capped = group(clocks_event_reasons=None, power_w=690.0)
    f = power.evaluate(one(busiest), peers_of(capped + [busiest]), CFG)
    assert f.evidence["trigger"] == "clock_below_peers_and_sw_power_cap" and "reasons not reported" in f.summary


def test_on_the_cap_by_its_draw_when_the_bit_is_not_set_in_this_sample():
    """The reason bits are read a moment apart from the clock and the draw: a GPU at 99% of its
    limit whose SW power cap bit is clear in this sample is on its cap all the same (a probe
    clearing the bit in 15% of capped samples drew 7-8 false `clock` episodes an hour on the
    serving nodes: "no clock-event reason explains it")."""
    uncapped = group(power_w=450.0, clocks_event_reasons=0)
    busiest = gpu(sm_clock_mhz=1782, power_w=695.0, clocks_event_reasons=0)
    assert busiest.reasons == SW_POWER_CAP and busiest.free_clock is None
    assert check_row(Row("bit clear, on the cap by its draw, peers below theirs", one(busiest), peers_of(uncapped + [busiest]), None)) is None
    capped = group(power_w=690.0)
    f = power.evaluate(one(busiest), peers_of(capped + [busiest]), CFG)
    assert f.evidence["trigger"] == "clock_below_peers_and_sw_power_cap"
    assert "on its power cap (by its draw; SW power cap bit not set)" in f.summary
    # Slowed by anything else, a GPU draws less: an unexplained slow clock stays one.
    slow = gpu(sm_clock_mhz=1700, power_w=560.0, clocks_event_reasons=0)
    assert check_row(Row("bit clear, drawing 80%", one(slow), peers_of(uncapped + [slow]), "clock", "warning")) is not None
