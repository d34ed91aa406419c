"""The scorer of bench/detection.py and the fixed-threshold baseline of bench/baseline.py."""

from __future__ import annotations

import pytest

from bench.baseline import BaselineSettings, FixedThresholdDetector
from bench.detection import percentile, score, ttd_samples
from bench.fleetgen import Fault

T = 1_000_000.0


def fault(fid, node, gpu, cause, start, end, nic=None, variant="v"):
    return Fault(fid, "c", node, gpu, nic, cause, variant, False, T + start, T + end)


def ep(node, gpu, cause, onset, detected, *, device=None, summary=""):
    return {"id": f"{node}/{gpu}/{cause}/{detected}", "cluster": "c", "node": node, "gpu": gpu, "cause": cause,
            "onset": T + onset, "detected_at": T + detected, "resolved_at": None,
            "evidence": {"device": device} if device else {}, "summary": summary}


def test_ttd_counts_the_first_faulty_sample_as_one():
    assert ttd_samples(T, T, 1.0) == 1
    assert ttd_samples(T, T + 1, 1.0) == 2
    assert ttd_samples(T, T + 10, 5.0) == 3
    assert ttd_samples(T, T + 9.9, 5.0) == 2
    assert ttd_samples(T, T + 10 - 1e-9, 5.0) == 3  # float noise on the grid still counts as the grid instant


def test_percentile_nearest_rank():
    assert percentile([], 95) is None
    assert percentile([3, 1, 2], 50) == 2
    assert percentile(list(range(1, 21)), 95) == 19
    assert percentile(list(range(1, 21)), 100) == 20


def test_hand_built_episodes_give_the_expected_scores():
    truth = [
        fault("f1", "n1", 0, "thermal", 100, 400),
        fault("f2", "n1", 3, "clock", 1000, 1300),
        fault("f3", "n2", None, "network", 500, 800, nic="mlx5_2"),
        fault("f4", "n3", 5, "xid", 700, 701),
        fault("f5", "n4", 1, "power", 200, 500),  # never detected
    ]
    episodes = [
        ep("n1", 0, "thermal", 100, 101),  # f1, TTD 2
        ep("n1", 0, "thermal", 300, 301),  # f1 again: a duplicate, still correct
        ep("n1", 3, "thermal", 1000, 1001),  # right GPU and time, wrong cause: FP
        ep("n1", 3, "clock", 1002, 1004),  # f2, TTD 5
        ep("n2", None, "network", 500, 500, device="mlx5_7"),  # another port of the node: FP
        ep("n2", None, "network", 500, 502, device="mlx5_2"),  # f3, TTD 3
        ep("n3", 5, "xid", 700, 700),  # f4, TTD 1
        ep("n3", 5, "xid", 1500, 1500),  # long after f4 (grace 120 s): FP
        ep("n9", 2, "ecc", 50, 50, summary="noise"),  # nothing there: FP
    ]
    sc = score(truth, episodes, interval=1.0, grace=120.0)
    o = sc["overall"]
    assert (o["faults"], o["detected"], o["episodes"], o["correct"], o["duplicates"], o["false_positives"]) == (5, 4, 9, 5, 1, 4)
    assert o["precision"] == pytest.approx(5 / 9)
    assert o["recall"] == pytest.approx(4 / 5)
    assert sorted(o["ttd"]) == [1, 2, 3, 5]
    assert o["ttd_median"] == 2.5 and o["ttd_p95"] == 5
    c = sc["causes"]
    assert c["thermal"]["precision"] == pytest.approx(2 / 3) and c["thermal"]["recall"] == 1.0
    assert c["power"]["recall"] == 0.0 and c["power"]["precision"] is None
    assert c["network"]["precision"] == 0.5 and c["network"]["ttd"] == [3]
    assert c["xid"]["false_positives"] == 1
    assert [m["id"] for m in sc["missed"]] == ["f5"]
    fps = {(fp["node"], fp["cause"]): fp for fp in sc["false_positives"]}
    assert fps[("n1", "thermal")]["near_fault"].startswith("f2 clock")  # wrong cause, named
    assert fps[("n9", "ecc")]["summary"] == "noise" and fps[("n9", "ecc")]["near_fault"] is None
    assert sc["variants"]["thermal/v"]["detected"] == 1
    assert sc["split"] == [{"id": "f1", "fault": "thermal/v", "node": "n1", "episodes": 2}]


def test_no_faults_no_episodes():
    sc = score([], [], interval=5.0, grace=60.0)
    assert sc["overall"]["precision"] is None and sc["overall"]["recall"] is None and sc["false_positives"] == []


def _sample(ts, **gpu):
    g = {"index": 0, "uuid": "GPU-x", "util_gpu_pct": 100.0, "sm_clock_mhz": 1800, "sm_clock_max_mhz": 1980,
         "temp_c": 70.0, "clocks_event_reasons": 0x4, "pcie_gen": 5, "pcie_gen_max": 5, "pcie_width": 16,
         "pcie_width_max": 16, "nvlink_links_up": 18, "nvlink_links_total": 18, "xids": []}
    g.update(gpu)
    return {"ts": ts, "gpus": [g], "nics": [{"device": "mlx5_0", "port": 1, "state": "ACTIVE", "rate_gbps": 400.0}]}


def test_baseline_thresholds_and_hysteresis():
    b = FixedThresholdDetector()
    strict = FixedThresholdDetector(BaselineSettings(count_power_cap=True))
    series = [_sample(0), _sample(1, temp_c=90.0, clocks_event_reasons=0x68), _sample(2, temp_c=88.0),
              _sample(3), _sample(4), _sample(5), _sample(6, xids=[{"xid": 13, "ts": 5.5}]),
              {"ts": 7, "gpus": [], "nics": [{"device": "mlx5_0", "port": 1, "state": "DOWN", "rate_gbps": 400.0}]}]
    for s in series:
        b.feed("c", "n", s)
        strict.feed("c", "n", s)
    eps = {(e["cause"], e["onset"]): e for e in b.finish()}
    assert set(eps) == {("thermal", 1), ("xid", 6), ("lost", 7), ("network", 7)}
    assert eps[("thermal", 1)]["resolved_at"] == 5  # three clean samples after the last hot one
    assert eps[("network", 7)]["gpu"] is None and eps[("network", 7)]["evidence"]["device"] == "mlx5_0"
    assert any(e["cause"] == "power" for e in strict.finish())  # the routine SW power cap, flagged


def test_docs_fault_catalogue_matches_the_generator():
    from bench.detection import DOCS, VARIANTS_BEGIN, VARIANTS_END, variants_markdown

    text = DOCS.read_text()
    block = text.split(VARIANTS_BEGIN, 1)[1].split(VARIANTS_END, 1)[0].strip()
    assert block == variants_markdown(), "run python bench/detection.py --write-docs (or fix docs/detection.md)"
