"""The numbers behind an episode's chart: which metrics a cause is charted by, counters as
rates, the peers' band over time buckets (busy peers only), reason-bit spans, the window."""

from __future__ import annotations

import pytest

from server.ui import series
from server.ui.series import METRICS, band, build_chart, busy_rows, charts_for, episode_window, points, quantile, reason_spans

T0 = 1_700_000_000.0


def row(t: float, **kw) -> dict:
    return {"ts": T0 + t, "lost": False, "util_gpu_pct": 98.0, "clocks_event_reasons": 0, **kw}


@pytest.mark.parametrize("cause, evidence, keys", [
    ("thermal", {"metric": "sm_clock_mhz"}, ["sm_clock_mhz", "temp_c"]),
    ("power", {"metric": "power_limit_w"}, ["power_limit_w", "sm_clock_mhz"]),
    ("nvlink", {"metric": "nvlink_links_up"}, ["nvlink_links_up", "nvlink_gbps"]),
    ("nvlink", {"metric": "nvlink_bps"}, ["nvlink_gbps", "nvlink_links_up"]),
    ("network", {"metric": "bps"}, ["nic_gbps", "nic_rate_gbps"]),
    ("network", {"metric": "rate_gbps"}, ["nic_rate_gbps", "nic_gbps"]),
    ("network", {"metric": "state"}, ["nic_gbps", "nic_rate_gbps"]),
    ("clock", None, ["sm_clock_mhz", "temp_c"]),
    ("pcie", {"metric": "pcie_gen"}, ["pcie_gen", "pcie_width"]),
    ("lost", {"metric": "lost"}, ["util_gpu_pct"]),
    ("something_new", {}, ["sm_clock_mhz"]),
    ("thermal", {"metric": "rate_gbps"}, ["sm_clock_mhz", "temp_c"]),  # a port's metric never charts a GPU
])
def test_what_each_cause_is_charted_by(cause, evidence, keys):
    assert [m.key for m in charts_for(cause, evidence)] == keys


def test_counters_become_rates_and_a_reset_gives_no_value():
    rows = [row(0, nvlink_tx_bytes_total=0, nvlink_rx_bytes_total=0), row(1, nvlink_tx_bytes_total=2e9, nvlink_rx_bytes_total=1e9),
            row(3, nvlink_tx_bytes_total=4e9, nvlink_rx_bytes_total=3e9), row(4, nvlink_tx_bytes_total=1e9, nvlink_rx_bytes_total=0),
            row(5, nvlink_tx_bytes_total=None, nvlink_rx_bytes_total=0)]
    assert points(rows, METRICS["nvlink_gbps"]) == [(T0 + 1, 3.0), (T0 + 3, 2.0), (T0 + 4, None), (T0 + 5, None)]
    assert points(rows[:2], METRICS["nvlink_links_up"]) == [(T0, None), (T0 + 1, None)]
    assert points([row(0, sm_clock_mhz=1980)], METRICS["sm_clock_mhz"]) == [(T0, 1980.0)]


def test_quantile_interpolates_like_numpy():
    assert quantile([1.0], 0.9) == 1.0
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert quantile([0.0, 10.0], 0.1) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        quantile([], 0.5)


def test_the_band_is_taken_per_bucket_across_peers():
    peers = [[(T0 + t, v) for t in range(10)] for v in (100.0, 200.0, 300.0, 400.0, 500.0)]
    peers.append([])  # a peer without samples in the window does not count
    out, n = band(peers, T0, 2.0)
    assert n == 5 and len(out) == 5
    t, lo, med, hi = out[0]
    assert t == T0 + 1.0 and med == 300.0 and lo == pytest.approx(140.0) and hi == pytest.approx(460.0)


def test_idle_or_lost_peers_do_not_widen_the_band():
    rows = [row(0, sm_clock_mhz=1980), row(1, sm_clock_mhz=345, util_gpu_pct=0.0), row(2, sm_clock_mhz=345, clocks_event_reasons=0x1),
            row(3, sm_clock_mhz=None, lost=True)]
    assert [r["ts"] for r in busy_rows(rows)] == [T0]


def test_reason_spans_follow_the_bits():
    bits = [0, 0x60, 0x60, 0x20, 0, 0x20]
    spans = reason_spans([row(t, clocks_event_reasons=b) for t, b in enumerate(bits)] + [row(20, clocks_event_reasons=0x20)])
    got = [(s.name, s.start - T0, s.end - T0) for s in spans]
    assert got == [("SW thermal slowdown", 1, 3.5), ("SW thermal slowdown", 5, 5.5), ("SW thermal slowdown", 20, 20.5),
                   ("HW thermal slowdown", 1, 2.5)]


def test_the_window_shows_the_time_before_the_onset():
    assert episode_window(T0, None, T0 + 30) == (T0 - 120, T0 + 30)  # at least 2 minutes before
    assert episode_window(T0, T0 + 600, T0 + 5000) == (T0 - 600, T0 + 660)  # as long before as it lasted, a minute after
    since, until = episode_window(T0, None, T0 + 86400)
    assert until == T0 + 86400 and until - since == 3600  # a day-long episode: its latest hour
    assert episode_window(T0, None, T0 - 5) == (T0 - 120, T0 + 1)  # a clock behind the onset still gives a window


def test_a_thermal_chart_from_rows():
    gpu = [row(t, sm_clock_mhz=1980 if t < 60 else 975, clocks_event_reasons=0 if t < 60 else 0x68) for t in range(120)]
    peer = [row(t, sm_clock_mhz=1970) for t in range(120)]
    idle = [row(t, sm_clock_mhz=345, util_gpu_pct=0.0) for t in range(120)]
    ep = {"onset": T0 + 60, "detected_at": T0 + 61, "resolved_at": None}
    chart = build_chart(METRICS["sm_clock_mhz"], ep, gpu, {1: peer, 2: peer, 3: idle}, since=T0, until=T0 + 120, target_label="n1 GPU 3")
    assert chart.band and all(lo == med == hi == 1970 for _, lo, med, hi in chart.band)  # the idle peer left out
    assert chart.band_label == "busy peers p10–p90 (n=2)"
    assert {s.name for s in chart.spans} == {"HW slowdown", "SW thermal slowdown", "HW thermal slowdown"}
    assert chart.gpu[0][1] == 1980 and chart.gpu[-1][1] == 975
    assert [m.label for m in chart.marks] == ["onset · detected"]
    assert chart.shade == (T0 + 60, T0 + 120)


def test_a_chart_without_peers_says_so():
    ep = {"onset": T0, "detected_at": T0 + 30, "resolved_at": T0 + 50}
    chart = build_chart(METRICS["temp_c"], ep, [row(t, temp_c=90.0) for t in range(60)], {}, since=T0 - 20, until=T0 + 60, target_label="x")
    assert chart.band == [] and chart.notes
    assert [m.label for m in chart.marks] == ["onset", "detected", "resolved"]


def test_the_step_is_never_finer_than_two_samples():
    assert series.choose_step(T0, T0 + 120, 1.0) == 2.0
    assert series.choose_step(T0, T0 + 3600, 1.0) == 15.0
    assert series.sample_interval([row(0), row(10), row(20)]) == 10
