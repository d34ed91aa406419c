"""The engine's own duties, with a one-line stand-in rule (the real rules have their own
table tests): peers sampled together, arrival-order independence, lateness, idle neutrality,
missing GPUs."""

from __future__ import annotations

import gc
import random
import weakref

import pytest

from server.detect import rules
from server.detect.engine import AGE_SLACK_S, WINDOW_ITEMS, Detector, NodeInstant
from server.detect.model import Finding, GpuObs, GpuPast
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


def fleet(ts_range, *, nodes=2, gpus=4, slow=None, idle_at=(), missing=None, clock_of=None):
    """NodeInstants; `slow` = (node, gpu) running 25% slow; `missing` = (node, gpu, from_ts);
    `clock_of(node, ts)` the healthy clock of a node at an instant (default 1980 MHz)."""
    items = []
    for ts in ts_range:
        for n in range(nodes):
            node = f"n{n}"
            rows = []
            healthy = clock_of(node, ts) if clock_of else 1980
            for g in range(gpus):
                if missing and (node, g) == missing[:2] and ts >= missing[2]:
                    continue
                clock = round(healthy * 0.75) if slow == (node, g) else healthy
                if ts in idle_at:
                    rows.append(gpu_row(node, g, ts, clock=345, util=0.0, reasons=1))
                else:
                    rows.append(gpu_row(node, g, ts, clock=clock))
            items.append(NodeInstant("c", node, {"job": "j"}, float(ts), rows, []))
    return items


def run(items, cfg=None):
    det = Detector(cfg or DetectionSettings(open_after_s=0, clear_after_s=0), gpu_rules=[slow_clock], nic_rules=[])
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
    _, out_of_order = run(delivered)
    assert sorted(map(_key, in_order)) == sorted(map(_key, out_of_order))
    assert in_order


def _key(change):
    c = change.change
    return change.entity, change.cause, type(c).__name__, getattr(c, "onset", None), getattr(c, "detected_at", None)


def test_healthy_nodes_sampled_at_other_moments_of_the_step_are_not_compared_as_simultaneous():
    # A power-capped job whose step is as long as the sampling interval: n0's agent always
    # samples in the compute phase (clock held at 1700 MHz by the power cap), n1's and n2's
    # always in the communication phase (1980 MHz). Nobody is slow: within each node every
    # GPU shows the same clock at the same instant.
    def phase_clock(node, ts):
        return 1700 if node == "n0" else 1980

    items = []
    for node, offset in (("n0", 0.0), ("n1", 2.5), ("n2", 2.5)):
        items += [i for i in fleet([t + offset for t in range(100, 160, 5)], nodes=3, clock_of=phase_clock) if i.node == node]
    items.sort(key=lambda i: i.ts)
    _, changes = run(items)
    assert changes == []


def test_a_slow_gpu_is_found_next_to_its_node_mates_whatever_its_nodes_phase():
    def phase_clock(node, ts):
        return 1700 if node == "n0" else 1980

    items = []
    for node, offset in (("n0", 0.0), ("n1", 2.5), ("n2", 2.5)):
        items += [i for i in fleet([t + offset for t in range(100, 160, 5)], nodes=3, clock_of=phase_clock, slow=("n0", 2))
                  if i.node == node]
    items.sort(key=lambda i: i.ts)
    _, changes = run(items)
    assert [(c.node, c.gpu, type(c.change).__name__) for c in changes] == [("n0", 2, "Opened")]
    assert changes[0].change.onset == 100.0 and changes[0].change.detected_at == 105.0


def test_a_node_is_judged_without_waiting_for_the_others():
    det = Detector(DetectionSettings(), gpu_rules=[slow_clock], nic_rules=[])
    for item in fleet([100.0, 101.0])[:3]:  # n0@100, n1@100, n0@101 — n1@101 not yet in
        det.add(item)
    det.advance()
    assert det.drain_judged() == {("c", "n0"): 101.0, ("c", "n1"): 100.0}
    # The cluster's judged_until is where every node still reporting has been judged.
    assert det.judged_until() == {"c": 100.0}


def test_a_node_replaying_ten_minutes_of_spool_is_judged_as_it_would_have_been_live():
    items = fleet(range(100, 1400, 5), nodes=3, slow=("n2", 1))
    _, live = run(items)
    # n2's agent could not push from 400 s to 1000 s: its spool is replayed after the others
    # have moved on ten minutes.
    held = [i for i in items if i.node == "n2" and 400 <= i.ts < 1000]
    rest = [i for i in items if i not in held]
    at = next(k for k, i in enumerate(rest) if i.ts >= 1000)
    det, replayed = run(rest[:at] + held + rest[at:])
    assert sorted(map(_key, live)) == sorted(map(_key, replayed))
    assert det.late_samples == 0


def test_a_node_that_went_silent_does_not_hold_back_the_others():
    items = [i for i in fleet(range(100, 200)) if not (i.node == "n1" and i.ts > 120)]
    det, _ = run(items)
    assert det.judged_until()["c"] == 199.0


def test_an_idle_pause_neither_confirms_nor_clears():
    pause = set(range(104, 112))
    _, changes = run(fleet(range(100, 120), slow=("n0", 0), idle_at=pause))
    kinds = [type(c.change).__name__ for c in changes]
    assert kinds == ["Opened"], "a checkpoint pause split the episode"


def test_a_gpu_that_stops_reporting_while_its_node_reports_is_lost():
    cfg = DetectionSettings(open_after_s=0, clear_after_s=0)
    _, changes = run(fleet(range(100, 130), missing=("n1", 3, 110)), cfg)
    lost = [c for c in changes if c.cause == "lost"]
    assert [(c.node, c.gpu, type(c.change).__name__) for c in lost] == [("n1", 3, "Opened")]
    assert lost[0].change.onset == 110.0 and lost[0].change.detected_at == 111.0


def test_a_lost_gpu_that_returns_resolves():
    items = fleet(range(100, 120), missing=("n1", 3, 105))
    items += fleet(range(120, 130))
    _, changes = run(items, DetectionSettings(open_after_s=0, clear_after_s=0))
    lost = [(type(c.change).__name__) for c in changes if c.cause == "lost"]
    assert lost == ["Opened", "Resolved"]
    resolved = [c for c in changes if isinstance(c.change, Resolved)][0]
    assert resolved.change.resolved_at == 120.0


# A stored batch, as the ingest log names it: (node, first, last instant). n0 and n1 were
# judged up to 990; n2 up to 300, then silent, and forgotten; lateness 600: the horizon is 390.
DROP_IF_LATE_CASES = {
    "already judged": (("n0", 120, 150), True),
    "partly judged": (("n0", 980, 1010), False),
    "a silent node, beyond the lateness allowance": (("n2", 310, 380), True),
    "a silent node, partly within the allowance": (("n2", 350, 420), False),
    "a new node, beyond the allowance": (("n3", 200, 230), True),
    "a new node, within the allowance": (("n3", 980, 1000), False),
}


@pytest.mark.parametrize("entry, dropped", DROP_IF_LATE_CASES.values(), ids=DROP_IF_LATE_CASES.keys())
def test_a_wholly_late_batch_is_counted_without_being_read(entry, dropped):
    """drop_if_late (before the rows are read) leaves the detector as add() of every instant would."""
    node, first, last = entry
    batch = [i for i in fleet(range(first, last + 10, 10), nodes=4) if i.node == node]
    before = fleet(range(100, 310, 10), nodes=3) + fleet(range(310, 1000, 10), nodes=2)
    by_rows, by_entry = (Detector(DetectionSettings(lateness_s=600), gpu_rules=[slow_clock], nic_rules=[]) for _ in range(2))
    for det in (by_rows, by_entry):
        for item in before:
            det.add(item)
        det.advance()
    for item in batch:
        by_rows.add(item)
    assert by_entry.drop_if_late("c", node, first, last, len(batch)) is dropped
    if not dropped:
        for item in batch:
            by_entry.add(item)
    assert by_entry.drain_late() == by_rows.drain_late()
    assert by_entry.late_samples == by_rows.late_samples
    assert by_entry.advance() == by_rows.advance()
    assert by_entry.judged_until() == by_rows.judged_until()


def test_samples_already_judged_or_beyond_the_lateness_allowance_are_counted_per_node():
    det = Detector(DetectionSettings(lateness_s=600), gpu_rules=[slow_clock], nic_rules=[])
    for item in fleet(range(100, 1000, 10)):
        det.add(item)
    det.advance()
    # n0 sends 120..150 again (already judged); n2 joins with samples from 200..230, more than
    # 600 s behind the cluster's newest (990): both stored, neither judged.
    again = [i for i in fleet(range(120, 160, 10)) if i.node == "n0"]
    ancient = [i for i in fleet(range(200, 240, 10), nodes=3) if i.node == "n2"]
    for item in again + ancient:
        det.add(item)
    assert det.advance() == []
    assert det.drain_late() == {("c", "n0"): (4, 990.0 - 120.0), ("c", "n2"): (4, 390.0 - 200.0)}
    assert det.drain_late() == {}
    assert det.late_samples == 8
    # A newcomer within the allowance is judged.
    for item in [i for i in fleet(range(500, 540, 10), nodes=3) if i.node == "n2"]:
        det.add(item)
    det.advance()
    assert det.drain_late() == {}


def _dip_fleet(dip_samples: int) -> list[NodeInstant]:
    """Two nodes of 4 H100 at 1 s; GPU 2 of n1 drops 30% of its clock for `dip_samples` samples."""
    items = fleet(range(100, 160))
    for item in items:
        if item.node == "n1" and 120 <= item.ts < 120 + dip_samples:
            row = item.gpu_rows[2]
            row["sm_clock_mhz"], row["clocks_event_reasons"] = 1386, 0
    return items


def test_a_two_or_three_second_dip_at_1s_sampling_is_a_transient_not_a_straggler():
    for samples in (2, 3):
        det = Detector(DetectionSettings())  # the real rules, the default persistence
        changes = []
        for item in _dip_fleet(samples):
            det.add(item)
            changes += det.advance()
        assert changes == [], (samples, [(c.cause, c.change) for c in changes])


def test_a_dip_that_lasts_opens_once_its_run_spans_open_after_s():
    det = Detector(DetectionSettings())
    changes = []
    for item in _dip_fleet(10):
        det.add(item)
        changes += det.advance()
    opened = [c for c in changes if isinstance(c.change, Opened)]
    assert [(c.node, c.gpu, c.cause, c.change.finding.severity) for c in opened] == [("n1", 2, "clock", "critical")]
    assert opened[0].change.onset == 120.0 and opened[0].change.detected_at == 125.0
    evidence = opened[0].change.finding.evidence
    assert evidence["peers"]["count"] == 4 and evidence["peers"]["scope"].startswith("node n1")
    assert evidence["window"] == {"from": 124.0, "to": 125.0}


def test_a_node_silent_beyond_the_lateness_allowance_is_forgotten_and_starts_afresh():
    det = Detector(DetectionSettings(lateness_s=300), gpu_rules=[slow_clock], nic_rules=[])
    items = [i for i in fleet(range(100, 1000, 10), nodes=3) if not (i.node == "n2" and 300 <= i.ts < 900)]
    for item in items:
        det.add(item)
        det.advance()
        if item.ts == 800.0:
            # n2 silent since 290, more than 300 s behind: its windows are gone, the others' kept.
            assert {g for g in det.gpus if g.startswith("GPU-n2-")} == set()
            assert {g for g in det.gpus if g.startswith("GPU-n1-")} == {f"GPU-n1-{g}" for g in range(4)}
    # Back at 900: judged as a newcomer, nothing counted late.
    assert det.late_samples == 0
    assert det.drain_judged()[("c", "n2")] == 990.0


@pytest.mark.parametrize("interval, expected", [
    (5.0, 43),  # 210 s of sample time (rate window, or stale_after_s + two aligned windows, + one): 42 intervals
    (1.0, 120),  # 210 s would be 211 observations: the 120 cap holds
    (30.0, 8),
])
def test_windows_keep_what_the_rules_and_aligned_windows_look_back_over(interval, expected):
    """Issue #13 item 6 (memory): a window holds its last keep_s of sample time, not always 120
    observations (10 minutes of 5 s samples held ~870 B per GPU and port each: ~12 GB at 100,000
    GPUs). Equal verdicts are checked by the arrival-order and screen tests on fleets of every cause."""
    cfg = DetectionSettings(open_after_s=0, clear_after_s=0)
    det = Detector(cfg, gpu_rules=[slow_clock], nic_rules=[])
    assert det.keep_s == max(cfg.rate_window_s, cfg.stale_after_s + 2 * cfg.across_window_s) + cfg.across_window_s == 210
    for item in fleet([1000 + k * interval for k in range(200)], nodes=1, gpus=1):
        det.add(item)
        det.advance()
    items = det.gpus["GPU-n0-0"].window.items
    assert len(items) == expected
    assert items[-1].ts - items[0].ts <= det.keep_s


def test_windows_keep_whole_observations_only_as_far_back_as_the_rules_look():
    """Issue #13 item 6 (memory): with the default rules a window holds the newest observations
    whole (until it next ages) and, older, only what the rules and aligned windows across nodes
    read of them (model.GpuPast: the error rates summed over rate_window_s, NVLink throughput,
    power limit): 100,000 GPUs' windows were 4.7 GB with every observation whole, 2.9 GB with
    rate_window_s of them. Equal verdicts: the arrival-order, screen and across tests."""
    cfg = DetectionSettings(open_after_s=0, clear_after_s=0)
    det = Detector(cfg)
    for item in fleet([1000 + k * 5.0 for k in range(100)], nodes=1, gpus=1):
        det.add(item)
        det.advance()
    window = det.gpus["GPU-n0-0"].window
    latest = window.latest
    # Whole observations: the newest, and those since the last aging (batches, staggered across
    # windows by up to AGE_SLACK_S).
    assert all(isinstance(o, GpuObs) for o in window.recent)
    assert latest.ts - window.recent[0].ts <= 2 * AGE_SLACK_S
    assert all(isinstance(o, GpuPast) for o in window.past) and window.past[-1].ts < window.recent[0].ts
    assert latest.ts - window.past[0].ts <= det.keep_s + 2 * AGE_SLACK_S
    assert (window.past[0].busy, window.past[0].power_limit_w, window.past[0].nvlink_bps) == (True, 700.0, 2e9)
    assert (window.past[0].nvlink_crc_per_s, window.past[0].pcie_replay_per_s) == (0.0, 0.0)
    assert [o.ts for o in window.items] == [1000 + k * 5.0 for k in range(100 - len(window.items), 100)]
    assert len(window.items) >= 43 and len(window.past) >= 42 - 2 * AGE_SLACK_S / 5


@pytest.mark.parametrize("interval", [0.5, 0.9, 1.0, 5.0])
def test_a_window_capped_at_fast_sampling_keeps_no_hole(interval):
    """At the 120-observation cap the oldest go from the past records, never a whole observation
    from between them and the recent ones: an aligned window across that hole would have
    integrated one interval's rate over the gap."""
    det = Detector(DetectionSettings(open_after_s=0, clear_after_s=0))
    for item in fleet([1000 + k * interval for k in range(600)], nodes=1, gpus=8):  # eight windows: every stagger
        det.add(item)
        det.advance()
    for g in range(8):
        ts = [o.ts for o in det.gpus[f"GPU-n0-{g}"].window.items]
        assert ts == [1000 + k * interval for k in range(600 - len(ts), 600)]
        # At most WINDOW_ITEMS after each aging; until the next, up to WINDOW_ITEMS whole ones more.
        assert len(ts) <= 2 * WINDOW_ITEMS + 1


def test_what_the_engine_keeps_per_gpu_and_port_is_not_walked_by_the_cyclic_gc():
    """A full collection of the cyclic GC stops every thread of the collector: at 100,000 GPUs it
    walked the detector's state for up to 0.9 s (bench/scale.py). The state kept per GPU and port
    (its window, its last readings, its recent marks) is untracked; only a window's two lists
    are left for a collection to walk."""
    det = Detector(DetectionSettings(open_after_s=0, clear_after_s=0))
    items = fleet([1000 + k * 5.0 for k in range(30)], nodes=2, gpus=4)
    for item in items:
        item.nic_rows = [{"ts": item.ts, "device": "mlx5_0", "port": 1, "state": "ACTIVE", "rate_gbps": 400.0,
                          "tx_bytes_total": int(item.ts * 1e9), "rx_bytes_total": int(item.ts * 1e9)}]
        det.add(item)
        det.advance()
    states = [*det.gpus.values(), *det.nics.values()]
    assert len(states) == 10
    for state in states:
        kept = (state, state.window, state.recent, state.prev)
        assert not any(gc.is_tracked(o) for o in kept), [type(o).__name__ for o in kept if gc.is_tracked(o)]
        assert state.window.items  # they hold what they held before
        assert state.prev is not None


class _Row(dict):
    """A stored row that can be watched (a dict subclass takes a weak reference)."""


def test_the_engine_keeps_no_row_once_judged():
    """Issue #13 item 6 (memory): the engine kept each GPU's and port's last row whole (~40
    readings in a dict, a tenth of the detector's memory) for the next row's rates; it keeps
    their time and counters only (observe.py `prev`)."""
    det = Detector(DetectionSettings(open_after_s=0, clear_after_s=0))
    watched = []
    for item in fleet([1000 + k * 5.0 for k in range(6)], nodes=2, gpus=4):
        item.gpu_rows = [_Row(r) for r in item.gpu_rows]
        item.nic_rows = [_Row({"ts": item.ts, "device": "mlx5_0", "port": 1, "state": "ACTIVE", "rate_gbps": 400.0,
                               "tx_bytes_total": int(item.ts * 1e9), "rx_bytes_total": int(item.ts * 1e9)})]
        watched += [weakref.ref(r) for r in (*item.gpu_rows, *item.nic_rows)]
        det.add(item)
        det.advance()
    del item
    gc.collect()
    assert [w() for w in watched if w() is not None] == []
    state = det.nics[next(iter(det.nics))]
    assert (state.prev.ts, state.prev.tx_bytes_total) == (1025.0, int(1025.0 * 1e9))
    assert det.gpus["GPU-n0-0"].window.latest.nvlink_bps is not None  # the rates still come


def test_a_gpus_and_ports_observations_share_their_names():
    """Issue #13 item 6 (memory): a database driver returns new strings for every row; windows
    kept each observation's UUID, model, peer group, device and port state as its own copy."""
    # The rules given (not the defaults): every observation stays whole.
    det = Detector(DetectionSettings(open_after_s=0, clear_after_s=0), gpu_rules=rules.GPU_RULES, nic_rules=rules.NIC_RULES)
    for item in fleet([1000 + k * 5.0 for k in range(8)], nodes=2, gpus=4):
        item.gpu_rows = [{k: _fresh(v) if type(v) is str else v for k, v in r.items()} for r in item.gpu_rows]
        item.nic_rows = [{"ts": item.ts, "device": _fresh("mlx5_0"), "port": 1, "state": _fresh("ACTIVE"), "rate_gbps": 400.0,
                          "tx_bytes_total": int(item.ts * 1e9), "rx_bytes_total": int(item.ts * 1e9)}]
        det.add(item)
        det.advance()
    gpus = [o for state in det.gpus.values() for o in state.window.recent]
    ports = [o for state in det.nics.values() for o in state.window.recent]
    assert len(gpus) == 64 and len(ports) == 16
    assert len({id(o.uuid) for o in gpus}) == 8 and len({id(o.model) for o in gpus}) == 1 and len({id(o.group) for o in gpus}) == 1
    assert len({id(o.device) for o in ports}) == 1 and len({id(o.state) for o in ports}) == 1


def _fresh(text: str) -> str:
    return text.encode().decode()


def test_a_counter_that_did_not_move_costs_its_observations_no_float_of_their_own():
    """Issue #13 item 6 (memory): an error counter's rate is 0.0 in nearly every observation;
    each was a float object of its own (24 bytes, four per GPU observation and two per port's)."""
    det = Detector(DetectionSettings(open_after_s=0, clear_after_s=0))
    for item in fleet([1000 + k * 5.0 for k in range(12)], nodes=2, gpus=4):
        det.add(item)
        det.advance()
    whole = [o for state in det.gpus.values() for o in state.window.recent if o.ts > 1000]
    past = [o for state in det.gpus.values() for o in state.window.past if o.ts > 1000]
    assert len(whole) + len(past) == 8 * 11 and whole and past
    assert {o.nvlink_crc_per_s for o in whole + past} == {0.0}
    assert len({id(o.nvlink_crc_per_s) for o in whole}) == 1
    assert all(o.errors is None for o in past)  # and a past record keeps no rates of errors that did not move


def test_a_slow_gpu_among_three_of_its_group_is_found():
    """Found by a probe on fleets unlike fleetgen's: with min_peers at 4, a node with three GPUs
    of a job (or four, one idle) had no peers, and a GPU 25% slower than its two neighbours
    was never flagged (recall 0.868 on a fleet of 3-GPU nodes)."""
    det = Detector(DetectionSettings(open_after_s=0, clear_after_s=0))
    changes = []
    for item in fleet([1000 + k * 5.0 for k in range(48)], nodes=1, gpus=3, slow=("n0", 1)):
        det.add(item)
        changes += det.advance()
    # The builder's GPUs carry the SW power cap bit: its triage names the cause power, opened
    # once it has lasted power_capped_open_after_s.
    opened = [c for c in changes if isinstance(c.change, Opened)]
    assert {(c.uuid, c.cause) for c in opened} == {("GPU-n0-1", "power")}
    assert opened[0].change.detected_at - opened[0].change.onset >= DetectionSettings().power_capped_open_after_s


def _node_series(ts_range, uuids_of):
    """One node of four GPUs; `uuids_of(ts)` its GPUs' UUIDs by index (None: not reported)."""
    items = []
    for ts in ts_range:
        rows = []
        for index, uuid in enumerate(uuids_of(ts)):
            if uuid is not None:
                row = gpu_row("n0", index, float(ts))
                row["uuid"] = uuid
                rows.append(row)
        items.append(NodeInstant("c", "n0", {"job": "j"}, float(ts), rows, []))
    return items


def test_a_gpu_replaced_while_its_node_was_down_is_not_lost():
    """Found by a probe: a node back from repair with GPU 3 swapped (a new UUID in its slot)
    opened a critical `lost` episode for the old GPU that never ended, and a whole new board
    eight of them: a node drained for good by the hints."""
    old, new = ["GPU-a", "GPU-b", "GPU-c", "GPU-d"], ["GPU-a", "GPU-b", "GPU-c", "GPU-NEW"]
    # GPU-d opens a lost episode first (missing while its node reports), then the node goes
    # down and comes back with another GPU in slot 3.
    items = _node_series(range(100, 110), lambda ts: old)
    items += _node_series(range(110, 115), lambda ts: old[:3] + [None])
    items += _node_series(range(700, 720), lambda ts: new)
    _, changes = run(items)
    lost = [(c.uuid, type(c.change).__name__, c.change.resolved_at if isinstance(c.change, Resolved) else None)
            for c in changes if c.cause == "lost"]
    assert lost == [("GPU-d", "Opened", None), ("GPU-d", "Resolved", 700.0)]
    swapped = _node_series(range(100, 110), lambda ts: old) + _node_series(range(700, 720), lambda ts: new)
    assert [c for c in run(swapped)[1] if c.cause == "lost"] == []


def test_a_gpu_vanishing_is_lost_even_when_the_others_are_renumbered():
    """After a GPU falls off the bus, NVML enumerates the rest from 0 again: the GPUs after it
    take lower indices, but they are known to the node, so none is taken for a replacement."""
    items = _node_series(range(100, 110), lambda ts: ["GPU-a", "GPU-b", "GPU-c", "GPU-d"])
    items += _node_series(range(110, 120), lambda ts: ["GPU-a", "GPU-c", "GPU-d"])
    opened = [(c.uuid, c.cause) for c in run(items)[1] if isinstance(c.change, Opened)]
    assert opened == [("GPU-b", "lost")]
