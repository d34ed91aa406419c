"""Hardware faults that wait for their remedy (server/hints/remedy.py), as pure functions: which
resolved episodes keep holding their hint, what evidence releases them (a reboot after the fault
with the GPU sampled clean since, a replaced GPU, an operator's ack), and the hint that results
after the cool-down."""

from __future__ import annotations

import pytest

from server.hints.compute import entity_hint
from server.hints.remedy import Ack, GpuFacts, hold, remedy_for
from server.hints.settings import HintSettings

ONSET, RESOLVED = 1000.0, 1005.0  # an XID episode resolves 5 s after it opens
UUID = "GPU-gpu-node-006-6"


def episode(cause="xid", xids=(79,), resolved=RESOLVED, gpu=6, **evidence):
    ev = {"xids": list(xids), **evidence} if xids else dict(evidence)
    return {"id": 1, "cluster": "prod", "node": "gpu-node-006", "gpu": gpu, "uuid": UUID, "cause": cause,
            "severity": "critical", "onset": ONSET, "detected_at": ONSET, "resolved_at": resolved, "evidence": ev,
            "summary": f"GPU {gpu} hardware XID {xids[0] if xids else '-'}"}


REBOOTED = GpuFacts(uuid=UUID, boot_time=2000.0, last_ts=2100.0, last_lost=False, last_remap_pending=False)


def ack(**kw):
    base = {"cluster": "prod", "node": "gpu-node-006", "gpu": None, "sample_time": 1500.0, "acked_at": 1.7e9, "acked_by": "ops-alice"}
    return Ack(**(base | kw))


HOLD_CASES = [
    # (what, episode, facts, acks, remedy held for (None: not held))
    ("XID 79 fallen off the bus: reboot", episode(xids=(79,)), None, [], "reboot"),
    ("XID 48 double-bit ECC: reset", episode(xids=(48,)), None, [], "reset"),
    ("XID 95 uncontained ECC: reset", episode(xids=(95,)), None, [], "reset"),
    ("XID 119 GSP RPC timeout: reset", episode(xids=(119,)), None, [], "reset"),
    ("XID 74 NVLink: reset", episode(xids=(74,)), None, [], "reset"),
    ("XID 61 micro-controller breakpoint: field", episode(xids=(61,)), None, [], "field"),
    ("an XID the table does not name: field", episode(xids=(157,)), None, [], "field"),
    ("the gravest of several", episode(xids=(94, 79)), None, [], "reboot"),
    ("XID 94 contained ECC: restart the app, no hold", episode(xids=(94,)), None, [], None),
    ("XID 63 remap recording event: ignore", episode(xids=(63,)), None, [], None),
    ("XID 92 high SBE rate: ignore", episode(xids=(92,)), None, [], None),
    ("still open: held by being open", episode(resolved=None), None, [], None),
    ("ecc with new uncorrected errors: reset", episode(cause="ecc", xids=(), ecc_uncorrected_new=2), None, [], "reset"),
    ("ecc with XID 48 in its evidence: reset", episode(cause="ecc", xids=(48,), ecc_uncorrected_new=1), None, [], "reset"),
    ("ecc, only a pending remap: the open episode holds", episode(cause="ecc", xids=(), remapped_rows_pending=True), None, [], None),
    ("not a hardware-fault cause", episode(cause="thermal", xids=()), None, [], None),
    # evidence
    ("rebooted after the fault, sampled clean since", episode(), REBOOTED, [], None),
    ("reboot covers a reset too", episode(xids=(48,)), REBOOTED, [], None),
    ("booted before the fault", episode(), GpuFacts(uuid=UUID, boot_time=900.0, last_ts=2100.0, last_lost=False), [], "reboot"),
    ("rebooted, GPU not sampled since", episode(), GpuFacts(uuid=UUID, boot_time=2000.0, last_ts=1900.0), [], "reboot"),
    ("rebooted, GPU never sampled", episode(), GpuFacts(uuid=UUID, boot_time=2000.0), [], "reboot"),
    ("rebooted, GPU lost", episode(), GpuFacts(uuid=UUID, boot_time=2000.0, last_ts=2100.0, last_lost=True), [], "reboot"),
    ("rebooted, row remap pending", episode(xids=(48,)), GpuFacts(uuid=UUID, boot_time=2000.0, last_ts=2100.0, last_remap_pending=True), [], "reset"),
    ("no boot time reported", episode(), GpuFacts(uuid=UUID, last_ts=2100.0, last_lost=False), [], "reboot"),
    ("a reboot is no field check", episode(xids=(61,)), REBOOTED, [], "field"),
    ("GPU replaced: a field check done", episode(xids=(61,)), GpuFacts(uuid="GPU-new"), [], None),
    # acks
    ("acked for the node", episode(), None, [ack()], None),
    ("acked for this GPU", episode(), None, [ack(gpu=6)], None),
    ("acked for another GPU", episode(), None, [ack(gpu=5)], "reboot"),
    ("acked for another node", episode(), None, [ack(node="gpu-node-005")], "reboot"),
    ("acked for another cluster", episode(), None, [ack(cluster="lab")], "reboot"),
    ("acked before the fault began", episode(), None, [ack(sample_time=999.0)], "reboot"),
    ("acked a field check", episode(xids=(61,)), None, [ack()], None),
]


@pytest.mark.parametrize(("what", "ep", "facts", "acks", "held"), HOLD_CASES, ids=[c[0] for c in HOLD_CASES])
def test_hold(what, ep, facts, acks, held):
    got = hold(ep, facts, acks)
    assert (got or {}).get("remedy") == held
    if held:
        assert "laggard ack" in got["until"]


def test_remedy_table_override():
    cfg = HintSettings(xid_remedies={79: "none", 94: "reset"})
    assert remedy_for(episode(xids=(79,)), cfg.remedy_table()) is None
    assert remedy_for(episode(xids=(94,)), cfg.remedy_table()) == "reset"


NOW = RESOLVED + 900.0 + 3600.0  # an hour past the default cool-down

HINT_CASES = [
    # (what, episode, settings, facts, acks, action after the cool-down)
    ("XID 79 stays drain", episode(xids=(79,)), {}, None, [], "drain"),
    ("XID 48 stays drain", episode(xids=(48,)), {}, None, [], "drain"),
    ("XID 94 clears", episode(xids=(94,)), {}, None, [], "ok"),
    ("XID 79 after the reboot clears", episode(xids=(79,)), {}, REBOOTED, [], "ok"),
    ("XID 79 acked clears", episode(xids=(79,)), {}, None, [ack()], "ok"),
    ("holding turned off: cool-down only", episode(xids=(79,)), {"hold_until_remedy": False}, None, [], "ok"),
]


@pytest.mark.parametrize(("what", "ep", "cfg", "facts", "acks", "action"), HINT_CASES, ids=[c[0] for c in HINT_CASES])
def test_hint_after_the_cool_down(what, ep, cfg, facts, acks, action):
    hint = entity_hint([ep], now=NOW, cfg=HintSettings(**cfg), facts=facts, acks=acks)
    assert hint.action == action
    if action == "drain":
        [reason] = hint.reasons
        assert (reason["cause"], reason["resolved_at"], reason["clears_at"]) == ("xid", RESOLVED, None)
        assert reason["held"]["remedy"] in ("reset", "reboot") and hint.since == ONSET and hint.capacity == 0.0


def test_within_the_cool_down_a_held_fault_shows_no_clearing_time():
    hint = entity_hint([episode()], now=RESOLVED + 1, cfg=HintSettings())
    assert hint.action == "drain" and hint.reasons[0]["clears_at"] is None
    released = entity_hint([episode()], now=RESOLVED + 1, cfg=HintSettings(), acks=[ack()])
    assert released.action == "drain" and released.reasons[0]["clears_at"] == RESOLVED + 900.0  # then the cool-down runs
