"""The engine's own duties, with a one-line stand-in rule (the real rules have their own
table tests): watermarks, arrival-order independence, idle neutrality, missing GPUs."""

from __future__ import annotations

import random

from server.detect.engine import Detector, NodeInstant
from server.detect.model import Finding
from server.detect.persistence import Opened, Resolved
from server.detect.settings import DetectionSettings


def slow_clock(window, peers, cfg):
    """Stand-in rule: flag a busy GPU whose clock ratio is 10% under its peers' median."""
    obs = window.latest
    if peers is None or peers.sm_clock_ratio is None or not obs.busy:
        return None
    if obs.sm_clock_ratio < peers.sm_clock_ratio.median - 0.10:
        return Finding(cause="clock", severity="warning", summary=f"GPU {obs.index} slow", evidence={"ratio": obs.sm_clock_ratio})
    return None


def gpu_row(node: str, index: int, ts: float, *, clock: int = 1980, util: float = 99.0, reasons: int = 4) -> dict:
    return {
        "cluster": "c", "node": node, "uuid": f"GPU-{node}-{index}", "index": index, "model": "H100", "ts": ts, "lost": False,
        "util_gpu_pct": util, "sm_clock_mhz": clock, "sm_clock_max_mhz": 1980, "temp_c": 65.0, "power_w": 650.0, "power_limit_w": 700.0,
        "clocks_event_reasons": reasons, "pcie_gen": 5, "pcie_gen_max": 5, "pcie_width": 16, "pcie_width_max": 16,
        "nvlink_links_up": 18, "nvlink_links_total": 18, "ecc_uncorrected_total": 0, "remapped_rows_pending": False,
        "nvlink_tx_bytes_total": int(ts * 1e9), "nvlink_rx_bytes_total": int(ts * 1e9), "nvlink_crc_errors_total": 0,
        "nvlink_replay_errors_total": 0, "nvlink_recovery_errors_total": 0, "pcie_replay_total": 0,
    }


def fleet(ts_range, *, nodes=2, gpus=4, slow=None, idle_at=(), missing=None):
    """NodeInstants; `slow` = (node, gpu) running 25% slow; `missing` = (node, gpu, from_ts)."""
    items = []
    for ts in ts_range:
        for n in range(nodes):
            node = f"n{n}"
            rows = []
            for g in range(gpus):
                if missing and (node, g) == missing[:2] and ts >= missing[2]:
                    continue
                clock = 1485 if slow == (node, g) else 1980
                if ts in idle_at:
                    rows.append(gpu_row(node, g, ts, clock=345, util=0.0, reasons=1))
                else:
                    rows.append(gpu_row(node, g, ts, clock=clock))
            items.append(NodeInstant("c", node, {"job": "j"}, float(ts), rows, []))
    return items


def run(items, cfg=None):
    det = Detector(cfg or DetectionSettings(settle_s=3, clear_after_s=0), gpu_rules=[slow_clock], nic_rules=[])
    changes = []
    for item in items:
        det.add(item)
        changes += det.advance()
    changes += det.advance()
    return det, changes


def test_a_slow_gpu_opens_one_episode_at_the_second_sample():
    _, changes = run(fleet(range(100, 110), slow=("n1", 2)))
    opened = [c for c in changes if isinstance(c.change, Opened)]
    assert [(c.node, c.gpu, c.cause) for c in opened] == [("n1", 2, "clock")]
    assert opened[0].change.onset == 100.0 and opened[0].change.detected_at == 101.0


def test_a_healthy_fleet_opens_nothing():
    _, changes = run(fleet(range(100, 130)))
    assert changes == []


def test_arrival_order_does_not_change_the_outcome():
    items = fleet(range(100, 140), nodes=3, slow=("n2", 1))
    _, in_order = run(items)
    # Agents deliver batches of several samples, out of step with each other: node by node,
    # each a batch or two ahead of or behind the others.
    rng = random.Random(3)
    batches = []
    for node in ("n0", "n1", "n2"):
        mine = [i for i in items if i.node == node]
        batches += [(mine[k].ts + rng.uniform(0, 8), mine[k : k + 5]) for k in range(0, len(mine), 5)]
    delivered = [item for _, batch in sorted(batches, key=lambda b: b[0]) for item in batch]
    assert [i.ts for i in delivered] != [i.ts for i in items]
    # Skew up to 13 s of sample time: inside the settle allowance at the start.
    _, out_of_order = run(delivered, DetectionSettings(settle_s=20, clear_after_s=0))
    key = lambda c: (c.entity, c.cause, type(c.change).__name__, getattr(c.change, "onset", None), getattr(c.change, "detected_at", None))
    assert sorted(map(key, in_order)) == sorted(map(key, out_of_order))
    assert in_order


def test_an_instant_waits_for_every_active_node():
    det = Detector(DetectionSettings(settle_s=0), gpu_rules=[slow_clock], nic_rules=[])
    for item in fleet([100.0, 101.0])[:3]:  # n0@100, n1@100, n0@101 — n1@101 not yet in
        det.add(item)
    det.advance()
    assert det.judged_until() == {"c": 100.0}


def test_a_new_cluster_waits_to_hear_from_its_late_starters():
    det = Detector(DetectionSettings(settle_s=10), gpu_rules=[slow_clock], nic_rules=[])
    items = fleet(range(100, 130))
    early = [i for i in items if i.node == "n0" and i.ts < 108]
    for item in early:
        det.add(item)
    det.advance()
    assert det.judged_until() == {}
    for item in items:
        if item not in early:
            det.add(item)
    det.advance()
    assert det.late_samples == 0
    assert det.judged_until() == {"c": 129.0}


def test_an_idle_pause_neither_confirms_nor_clears():
    pause = set(range(104, 112))
    _, changes = run(fleet(range(100, 120), slow=("n0", 0), idle_at=pause))
    kinds = [type(c.change).__name__ for c in changes]
    assert kinds == ["Opened"], "a checkpoint pause split the episode"


def test_a_gpu_that_stops_reporting_while_its_node_reports_is_lost():
    cfg = DetectionSettings(settle_s=3, clear_after_s=0)
    _, changes = run(fleet(range(100, 130), missing=("n1", 3, 110)), cfg)
    lost = [c for c in changes if c.cause == "lost"]
    assert [(c.node, c.gpu, type(c.change).__name__) for c in lost] == [("n1", 3, "Opened")]
    assert lost[0].change.onset == 110.0 and lost[0].change.detected_at == 111.0


def test_a_lost_gpu_that_returns_resolves():
    items = fleet(range(100, 120), missing=("n1", 3, 105))
    items += fleet(range(120, 130))
    _, changes = run(items, DetectionSettings(settle_s=3, clear_after_s=0))
    lost = [(type(c.change).__name__) for c in changes if c.cause == "lost"]
    assert lost == ["Opened", "Resolved"]
    resolved = [c for c in changes if isinstance(c.change, Resolved)][0]
    assert resolved.change.resolved_at == 120.0


def test_a_node_that_went_silent_does_not_hold_back_the_others():
    items = [i for i in fleet(range(100, 200)) if not (i.node == "n1" and i.ts > 120)]
    det, _ = run(items)
    assert det.judged_until()["c"] == 199.0


def test_samples_behind_the_judged_instant_are_drained_per_node_with_how_far_behind():
    det = Detector(DetectionSettings(settle_s=0), gpu_rules=[slow_clock], nic_rules=[])
    for item in fleet(range(100, 120)):
        det.add(item)
    det.advance()
    until = det.judged_until()["c"]
    late = [i for i in fleet(range(100, 104), nodes=3) if i.node == "n2"]
    for item in late:
        det.add(item)
    assert det.drain_late() == {("c", "n2"): (4, until - 100.0)}
    assert det.drain_late() == {}
    assert det.late_samples == 4
