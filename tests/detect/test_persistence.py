"""k of n to open, m clean instants to resolve: table-driven over verdict sequences."""

from __future__ import annotations

import pytest

from server.detect.model import Finding
from server.detect.persistence import Condition, Escalated, Opened, Resolved


def hit(severity="warning", immediate=False):
    return Finding(cause="clock", severity=severity, summary="slow", evidence={}, immediate=immediate)


W, C, NOW = hit(), hit("critical"), hit(immediate=True)  # warning, critical, immediate
LONG = Finding(cause="power", severity="warning", summary="capped", evidence={}, open_after_s=4.0)  # asks for a 4 s run
ROW = Finding(cause="network", severity="warning", summary="port moving less", evidence={}, in_row=2)  # a throughput figure alone
_ = None
P = "pause"  # an instant that neither confirms nor clears (an idle GPU): Condition.interrupt

CASES = [
    # (name, verdicts per instant (ts = 1, 2, 3, ...), expected changes as (ts, kind, detail))
    ("one noisy sample never opens", [_, W, _, _, _, _], []),
    ("two of three open at the second hit, onset at the first", [_, W, _, W, _, _], [(4, "open", 2)]),
    ("two in a row open", [W, W], [(2, "open", 1)]),
    ("isolated hits further apart than n never open", [W, _, _, W, _, _, W], []),
    ("immediate opens on its first instant", [_, NOW], [(2, "open", 2)]),
    ("resolves after three clean instants, at the first clean one", [W, W, W, _, _, _], [(2, "open", 1), (6, "resolve", 4)]),
    ("a clean gap shorter than the hysteresis keeps one episode", [W, W, _, _, W, W, _, _, _], [(2, "open", 1), (9, "resolve", 7)]),
    ("escalates once to critical", [W, W, C, C, W], [(2, "open", 1), (3, "escalate", "critical")]),
    ("reopens as a new episode after resolving", [W, W, _, _, _, W, W], [(2, "open", 1), (5, "resolve", 3), (7, "open", 6)]),
    ("a finding asking for a 4 s run opens once its run spans 4 s", [LONG, LONG, LONG, LONG, LONG, LONG], [(5, "open", 1)]),
    ("...its run surviving one clean instant", [LONG, LONG, _, LONG, LONG, LONG], [(5, "open", 1)]),
    ("...and starting again after two", [LONG, LONG, _, _, LONG, LONG, LONG, LONG, LONG], [(9, "open", 5)]),
    ("a finding asking for 2 in a row: low, high, low, high never opens (a counter refreshed late)",
     [ROW, _, ROW, _, ROW, _, ROW], []),
    ("...two in a row open it, onset at the run's first hit", [ROW, _, ROW, ROW], [(4, "open", 1)]),
    ("...two hits with a pause between are not in a row (a checkpoint between two late refreshes)",
     [ROW, _, ROW, P, P, P, ROW, _, ROW], []),
    ("...two in a row after a pause open it", [ROW, P, ROW, ROW], [(4, "open", 1)]),
    ("a pause is no miss: two of three across it open", [W, P, P, W], [(4, "open", 1)]),
]


@pytest.mark.parametrize("name,verdicts,expected", CASES, ids=[c[0] for c in CASES])
def test_condition(name, verdicts, expected):
    cond = Condition(n=3, k=2, clear_after=3)
    seen = []
    for ts, verdict in enumerate(verdicts, start=1):
        if verdict is P:
            cond.interrupt(float(ts))
            continue
        change = cond.step(float(ts), verdict)
        if isinstance(change, Opened):
            seen.append((ts, "open", change.onset))
        elif isinstance(change, Resolved):
            seen.append((ts, "resolve", change.resolved_at))
        elif isinstance(change, Escalated):
            seen.append((ts, "escalate", change.finding.severity))
    assert seen == expected


def test_idle_only_when_nothing_is_remembered():
    cond = Condition(n=3, k=2, clear_after=3)
    assert cond.idle
    cond.step(1.0, W)
    assert not cond.idle
    for ts in (2.0, 3.0, 4.0):
        cond.step(ts, None)
    assert cond.idle


def test_resolution_also_waits_for_enough_sample_time():
    cond = Condition(n=3, k=2, clear_after=3, clear_after_s=10.0)
    changes = [cond.step(float(ts), W if ts < 3 else None) for ts in range(1, 20)]
    resolved = [(ts, c.resolved_at) for ts, c in enumerate(changes, start=1) if isinstance(c, Resolved)]
    # Clean from ts 3 on: three clean instants by ts 5, but 10 s of them only at ts 13.
    assert resolved == [(13, 3.0)]


def test_a_finding_may_date_its_own_onset():
    cond = Condition(n=3, k=2, clear_after=3)
    found = Finding(cause="lost", severity="critical", summary="gone", evidence={}, immediate=True, onset=7.0)
    change = cond.step(9.0, found)
    assert isinstance(change, Opened) and change.onset == 7.0 and change.detected_at == 9.0


# At 1 s sampling with open_after_s = 5: the run of hits must span 5 s of sample time.
SPAN_CASES = [
    # (name, interval, verdicts, expected (ts, kind, detail))
    ("a 2 s dip (three slow samples at 1 s) opens nothing", 1.0, [_, W, W, W, _, _, _, _], []),
    ("six slow samples at 1 s open, onset at the first", 1.0, [_, W, W, W, W, W, W, _], [(7, "open", 2.0)]),
    ("one clean sample inside the run keeps it", 1.0, [W, W, _, W, W, W, W], [(6, "open", 1.0)]),
    ("two clean samples in a row end the run", 1.0, [W, W, W, _, _, W, W, W, W], []),
    ("at 5 s two slow samples in a row suffice", 5.0, [_, W, W], [(15, "open", 10.0)]),
    ("immediate findings need no span", 1.0, [_, NOW], [(2, "open", 2.0)]),
]


@pytest.mark.parametrize("name,interval,verdicts,expected", SPAN_CASES, ids=[c[0] for c in SPAN_CASES])
def test_a_run_of_hits_must_span_open_after_s(name, interval, verdicts, expected):
    cond = Condition(n=3, k=2, clear_after=3, open_after_s=5.0)
    seen = []
    for k, verdict in enumerate(verdicts, start=1):
        ts = k * interval
        change = cond.step(ts, verdict)
        if isinstance(change, Opened):
            seen.append((ts, "open", change.onset))
    assert seen == expected
