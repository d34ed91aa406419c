"""Readiness after failed writes (server/store/write_health.py): down from a failure until a
write succeeds, and never longer than the hold, so that a collector out of its Service
(seeing no pushes) comes back to try. Times are given, not waited for."""

from __future__ import annotations

import pytest

from server.store.write_health import WriteHealth

HOLD_S = 30.0

CASES = [
    # (events as (at, "failed" | "succeeded"), asked at, expected answer)
    ([], 0.0, None),
    ([(10.0, "failed")], 10.0, "disk full"),
    ([(10.0, "failed")], 10.0 + HOLD_S, "disk full"),
    ([(10.0, "failed")], 10.0 + HOLD_S + 0.1, None),  # held no longer: ready again, to try
    ([(10.0, "failed"), (11.0, "succeeded")], 12.0, None),
    ([(10.0, "failed"), (11.0, "succeeded"), (20.0, "failed")], 21.0, "disk full"),
    ([(10.0, "failed"), (35.0, "failed")], 60.0, "disk full"),  # each failure holds anew
]


@pytest.mark.parametrize("events,at,expected", CASES)
def test_writes_are_failing_from_a_failure_until_a_success_or_the_hold(events, at, expected):
    health = WriteHealth(hold_s=HOLD_S)
    for when, what in events:
        if what == "failed":
            health.failed("disk full", now=when)
        else:
            health.succeeded()
    assert health.failing(now=at) == expected
