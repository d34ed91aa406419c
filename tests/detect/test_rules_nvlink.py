"""nvlink: links down, errors rising at a sustained rate, throughput far below busy peers."""

from __future__ import annotations

import pytest

from server.detect.model import SW_THERMAL, PeerStats, Robust
from server.detect.rules import nvlink
from tests.detect.builders import CFG, Row, check_row, gpu, group, h100_peers, idle_gpu, one, peers_of, series, tweak

PEERS = h100_peers()  # NVLink median 150 GB/s, MAD 1 GB/s → the 5% noise floor applies
CRC = "nvlink_crc_per_s"

ROWS = [
    # --- links down
    Row("2 of 18 links down", one(gpu(nvlink_links_up=16, nvlink_bps=130e9)), PEERS, "nvlink", "critical"),
    Row("links down on an idle GPU", one(idle_gpu(nvlink_links_up=17)), PEERS, "nvlink", "critical"),
    Row("links down without peers", one(gpu(nvlink_links_up=0)), None, "nvlink", "critical"),
    Row("links down and errors rising: one finding, critical",
        series(7, nvlink_links_up=17, counts={CRC: [2, 2, 2, 2, 2, 2]}), PEERS, "nvlink", "critical"),
    Row("GPU without NVLink (0 of 0)", one(gpu(nvlink_links_up=0, nvlink_links_total=0)), PEERS, None),
    Row("link counts unreadable", one(gpu(nvlink_links_up=None, nvlink_links_total=None)), PEERS, None),
    # --- errors over rate_window_s (60 s), samples every 10 s
    Row("CRC errors: 5 in the last 60 s (= threshold)", series(7, counts={CRC: [1, 1, 1, 1, 1, 0]}), PEERS, "nvlink", "warning"),
    Row("CRC errors: 30 in 60 s, steady", series(7, counts={CRC: [5, 5, 5, 5, 5, 5]}), PEERS, "nvlink", "warning"),
    Row("CRC + replay + recovery add up to 5", series(7, counts={CRC: [1, 1], "nvlink_replay_per_s": [1, 1], "nvlink_recovery_per_s": [0, 1]}),
        PEERS, "nvlink", "warning"),
    Row("errors rising on an idle GPU", series(7, make=idle_gpu, counts={CRC: [3, 3, 3]}), PEERS, "nvlink", "warning"),
    Row("CRC errors: 4 in 60 s (under threshold)", series(7, counts={CRC: [1, 0, 1, 0, 1, 1]}), PEERS, None),
    Row("a single CRC error now and then", series(7, counts={CRC: [0, 0, 1, 0, 0, 0]}), PEERS, None),
    Row("a burst older than the window", series(13, counts={CRC: [9, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]}), PEERS, None),
    Row("nvlink_errors_in_window raised to 10", series(7, counts={CRC: [1, 1, 1, 1, 1, 1]}), PEERS, None,
        cfg=tweak(nvlink_errors_in_window=10)),
    # --- throughput vs busy peers
    Row("throughput 40% below peers, clocks fine", one(gpu(nvlink_bps=90e9)), PEERS, "nvlink", "warning"),
    Row("throughput 25% below peers (under nvlink_bw_drop)", one(gpu(nvlink_bps=112e9)), PEERS, None),
    Row("throughput 35% below peers in a group of mixed work (wide spread)", one(gpu(nvlink_bps=97e9)),
        PeerStats("g", 8, nvlink_bps=Robust(150e9, 40e9, 8)), None),
    Row("throughput low but the GPU is idle", one(idle_gpu(nvlink_bps=0.0)), PEERS, None),
    Row("compute phase: peers move next to nothing", one(gpu(nvlink_bps=1e6)), h100_peers(nvlink_scale=0.001), None),
    Row("whole group's NVLink traffic falls together", one(gpu(nvlink_bps=60e9)), h100_peers(nvlink_scale=0.4), None),
    Row("no peers: throughput not judged", one(gpu(nvlink_bps=10e9)), None, None),
    # Peers as the engine makes them, the judged GPU among them (bench/fleetgen/serving.py's replicas).
    Row("one GPU at 60 GB/s, its 7 peers at ~150", one(gpu(nvlink_bps=60e9)), peers_of(group(7) + [gpu(nvlink_bps=60e9)]), "nvlink", "warning"),
    Row("a tensor-parallel pair at 60 GB/s beside replicas at ~150: their work's traffic", one(gpu(nvlink_bps=60e9)),
        peers_of(group(6) + [gpu(nvlink_bps=60e9), gpu(index=7, nvlink_bps=63e9)]), None),
    Row("a pair at 60 GB/s, the partner's figure unknown at this instant (not read): maybe shared", one(gpu(nvlink_bps=60e9)),
        peers_of(group(6) + [gpu(nvlink_bps=60e9), gpu(index=7, nvlink_bps=None)]), None),
    Row("a single-GPU replica (0 GB/s, links up and clean) beside tensor-parallel ones", one(gpu(nvlink_bps=0.0)),
        peers_of(group(7) + [gpu(nvlink_bps=0.0)]), None),
    Row("throughput unknown (first sample)", one(gpu(nvlink_bps=None)), PEERS, None),
    Row("throughput low because the GPU is thermally throttled: thermal only",
        one(gpu(nvlink_bps=80e9, sm_clock_mhz=1400, temp_c=90, clocks_event_reasons=SW_THERMAL)), PEERS, "thermal", "critical"),
    Row("throughput low because the clock is low: clock only", one(gpu(nvlink_bps=80e9, sm_clock_mhz=1500)), PEERS, "clock", "warning"),
]


@pytest.mark.parametrize("row", ROWS, ids=repr)
def test_nvlink_table(row):
    check_row(row)


def test_summary_combines_every_problem():
    win = series(7, nvlink_links_up=16, nvlink_bps=80e9, counts={CRC: [10, 10, 10], "nvlink_recovery_per_s": [0, 0, 2]})
    f = nvlink.evaluate(win, PEERS, CFG)
    assert f.summary == ("GPU 3 NVLink 16 of 18 links up; 32 NVLink errors in 60 s (CRC 30, recovery 2); "
                         "NVLink 80 GB/s vs peer median 150 GB/s (-47%)")
    assert (f.evidence["metric"], f.evidence["value"], f.evidence["expected"]) == ("nvlink_links_up", 16, 18)
    assert f.evidence["errors_in_window"] == {"CRC": 30.0, "replay": 0.0, "recovery": 2.0}


def test_throughput_evidence():
    f = nvlink.evaluate(one(gpu(nvlink_bps=90e9)), PEERS, CFG)
    assert f.summary == "GPU 3 NVLink 90 GB/s vs peer median 150 GB/s (-40%)"
    ev = f.evidence
    assert (ev["metric"], ev["value"], ev["peer_median"], ev["deviation"]) == ("nvlink_bps", 90e9, 150e9, -0.4)


def test_headline_numbers_belong_to_the_headline_metric():
    f = nvlink.evaluate(series(7, nvlink_bps=80e9, counts={CRC: [3, 3]}), PEERS, CFG)
    assert (f.evidence["metric"], f.evidence["value"]) == ("nvlink_errors_in_window", 6)
    assert "peer_median" not in f.evidence and f.evidence["peer_nvlink_bps"] == 150e9


def test_a_throughput_figure_alone_asks_for_two_hits_in_a_row():
    assert nvlink.evaluate(one(gpu(nvlink_bps=90e9)), PEERS, CFG).in_row == 2
    # With an error or a link down beside it, the graver problem opens as before.
    assert nvlink.evaluate(one(gpu(nvlink_links_up=16, nvlink_bps=90e9)), PEERS, CFG).in_row == 1
    assert nvlink.evaluate(series(7, nvlink_bps=80e9, counts={CRC: [3, 3]}), PEERS, CFG).in_row == 1
