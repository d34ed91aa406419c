"""The shared helpers: counter increases over a window of sample time, peer comparisons."""

from __future__ import annotations

import pytest

from server.detect.model import PeerStats, Robust
from server.detect.rules._common import clock_vs_peers, increase, new_in_window, throughput_vs_peers
from tests.detect.builders import CFG, T0, gpu, h100_peers, nic, one, series, window

R = "pcie_replay_per_s"


@pytest.mark.parametrize(
    "desc, win, expected",
    [
        ("steady 1 per 10 s over 6 intervals", series(7, counts={R: [1] * 6}), 6.0),
        ("the interval ending at the window start is outside", series(8, counts={R: [7, 0, 0, 0, 0, 0, 0]}), 0.0),
        ("longer window holds more", series(13, counts={R: [1] * 12}), 6.0),
        ("a single sample has no interval", one(gpu(pcie_replay_per_s=5.0)), 0.0),
        ("unknown rates count nothing", series(4, at={-1: {R: None}}), 0.0),
        ("negative rates are clamped", series(4, at={-1: {R: -1.0}}), 0.0),
        ("an interval straddling the start counts for its part inside",
         window(gpu(ts=T0), gpu(ts=T0 + 40, pcie_replay_per_s=0.1), gpu(ts=T0 + 80, pcie_replay_per_s=0.0)), 2.0),
        ("first kept sample borrows the usual interval",
         window(gpu(ts=T0, pcie_replay_per_s=0.2), gpu(ts=T0 + 10), gpu(ts=T0 + 20)), 2.0),
    ],
)
def test_increase(desc, win, expected):
    assert increase(win, R, 60.0) == pytest.approx(expected)


def test_new_in_window_sums_per_sample_increases():
    win = series(8, make=nic, at={0: {"link_downed_new": 3}, 5: {"link_downed_new": 1}, 6: {"link_downed_new": None}})
    assert new_in_window(win, "link_downed_new", 60.0) == 1


def test_clock_vs_peers_uses_the_peers_max_clock():
    v = clock_vs_peers(gpu(sm_clock_mhz=1600, sm_clock_max_mhz=1600), h100_peers(), CFG)
    assert v.peer_median == 1980 and v.deviation == pytest.approx(1600 / 1980 - 1) and v.low


def test_clock_vs_peers_needs_peers_and_a_clock():
    assert clock_vs_peers(gpu(), None, CFG) is None
    assert clock_vs_peers(gpu(sm_clock_mhz=None), h100_peers(), CFG) is None
    assert clock_vs_peers(gpu(), PeerStats("g", 8), CFG) is None


def test_throughput_vs_peers_respects_floor_and_spread():
    tight = Robust(100e9, 0.0, 8)
    assert throughput_vs_peers(60e9, tight, min_median=1e9, drop=0.3, cfg=CFG).low
    assert not throughput_vs_peers(75e9, tight, min_median=1e9, drop=0.3, cfg=CFG).low
    assert throughput_vs_peers(1.0, Robust(1e8, 0.0, 8), min_median=1e9, drop=0.3, cfg=CFG) is None
    assert not throughput_vs_peers(60e9, Robust(100e9, 30e9, 8), min_median=1e9, drop=0.3, cfg=CFG).low
