"""Limits by work (server/auth/worklimit.py), with the clock injected: no test waits."""

from __future__ import annotations

import pytest

from server.auth.worklimit import ConcurrencyCap, WorkBudget

# (steps, expected): each step is ("wait", key) / ("take", key, cost) / ("sleep", seconds); the
# expected list holds what each wait/take returned, rounded to 3 digits.
BUDGET_CASES = {
    "a batch larger than the balance is let in once, then the debt is waited out": (
        [("take", "a", 25), ("wait", "a"), ("take", "a", 1), ("sleep", 1.0), ("wait", "a"), ("sleep", 0.5), ("take", "a", 1), ("sleep", 0.01),
         ("take", "a", 1)],
        [0.0, 1.501, 1.501, 0.501, 0.001, 0.0],  # a balance of exactly 0 is not enough
    ),
    "keys are apart: one token's debt does not hold up another": (
        [("take", "heavy", 100), ("take", "heavy", 1), ("take", "light", 1), ("take", "light", 1)],
        [0.0, 9.001, 0.0, 0.0],
    ),
    "small batches pass until the burst is spent, then at the rate": (
        [("take", "a", 4), ("take", "a", 4), ("take", "a", 4), ("take", "a", 4), ("sleep", 0.4), ("take", "a", 4)],
        [0.0, 0.0, 0.0, 0.201, 0.0],
    ),
    "an idle key refills to the burst, no further": (
        [("take", "a", 10), ("sleep", 1000.0), ("take", "a", 10), ("take", "a", 1)],
        [0.0, 0.0, 0.001],
    ),
}


@pytest.mark.parametrize("steps, expected", BUDGET_CASES.values(), ids=BUDGET_CASES.keys())
def test_work_budget(steps, expected):
    now = [0.0]
    budget = WorkBudget(rate=10.0, burst=10.0, clock=lambda: now[0])
    got = []
    for op, *args in steps:
        if op == "sleep":
            now[0] += args[0]
        else:
            got.append(round(getattr(budget, op)(*args), 3))
    assert got == expected


def test_concurrency_cap_counts_per_key_and_frees_places():
    cap = ConcurrencyCap(2)
    assert [cap.enter("a"), cap.enter("a"), cap.enter("a"), cap.enter("b")] == [True, True, False, True]
    cap.leave("a")
    assert cap.enter("a") is True
    for _ in range(2):
        cap.leave("a")
    assert cap.in_flight("a") == 0 and cap.in_flight("b") == 1
