"""hw_slowdown: the HW slowdown bit without the HW thermal or HW power brake bit."""

from __future__ import annotations

import pytest

from server.detect.model import HW_SLOWDOWN, IDLE, SW_POWER_CAP
from server.detect.rules import hw_slowdown
from tests.detect.builders import CFG, Row, check_row, gpu, h100_peers, idle_gpu, one

PEERS = h100_peers()

ROWS = [
    Row("HW slowdown bit, clock 50% low", one(gpu(sm_clock_mhz=990, clocks_event_reasons=HW_SLOWDOWN)), PEERS, "hw_slowdown", "critical"),
    Row("HW slowdown bit without peers", one(gpu(sm_clock_mhz=990, clocks_event_reasons=HW_SLOWDOWN)), None, "hw_slowdown", "critical"),
    Row("HW slowdown + SW power cap: hw_slowdown, not power", one(gpu(sm_clock_mhz=990, clocks_event_reasons=HW_SLOWDOWN | SW_POWER_CAP)),
        PEERS, "hw_slowdown", "critical"),
    Row("HW slowdown and hot, no thermal bit: still hw_slowdown", one(gpu(sm_clock_mhz=990, temp_c=85, clocks_event_reasons=HW_SLOWDOWN)),
        PEERS, "hw_slowdown", "critical"),
    Row("HW slowdown on a GPU at 0% (the bit is never a power-saving state)",
        one(gpu(util_gpu_pct=0, sm_clock_mhz=86, clocks_event_reasons=HW_SLOWDOWN)), None, "hw_slowdown", "critical"),
    Row("HW slowdown next to the Idle bit", one(idle_gpu(clocks_event_reasons=IDLE | HW_SLOWDOWN)), PEERS, "hw_slowdown", "critical"),
    Row("no bits at all", one(gpu()), PEERS, None),
    Row("reasons unreadable (None), clock at peers", one(gpu(clocks_event_reasons=None)), PEERS, None),
]


@pytest.mark.parametrize("row", ROWS, ids=repr)
def test_hw_slowdown_table(row):
    check_row(row)


def test_summary():
    f = hw_slowdown.evaluate(one(gpu(sm_clock_mhz=990, clocks_event_reasons=HW_SLOWDOWN, power_w=350)), PEERS, CFG)
    assert f.summary == ("GPU 3 SM clock 990 MHz vs peer median 1980 MHz (-50%); HW slowdown (no thermal or power-brake bit); "
                         "66 °C vs 66 °C; drawing 350 W of 700 W limit")
    assert f.evidence["reasons"] == ["HW slowdown"]
