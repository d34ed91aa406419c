"""The job model of bench/rebalance.py (the collector part runs in the benchmark itself)."""

from __future__ import annotations

import pytest

from bench.rebalance import Rank, run_policy

A, M, C = 0.6, 0.15, 0.25


def fleet(*slow: Rank, healthy: int = 14) -> list[Rank]:
    return [Rank(f"h{i // 8}", i % 8, 1.0, 1.0, "ok", "ok", 1.0) for i in range(healthy)] + list(slow)


def test_a_healthy_fleet_runs_at_full_throughput():
    for policy in ("ignore", "exclude", "weighted", "oracle"):
        row = run_policy(policy, fleet(), 14, A, M, C)
        assert (row["gpus"], row["step"], row["throughput"]) == (14, pytest.approx(1.0), pytest.approx(1.0))


def test_step_time_is_the_slowest_rank_plus_the_all_reduce():
    ranks = fleet(Rank("s", 0, 0.5, 1.0, "rebalance", "rebalance", 0.5), Rank("l", 0, 1.0, 0.5, "drain", "drain", 0.0))
    ignore = run_policy("ignore", ranks, 16, A, M, C)
    assert ignore["step"] == pytest.approx(A / 0.5 + M + C / 0.5)  # half clock, half-speed link
    excluded = run_policy("exclude", ranks, 16, A, M, C)  # the drain node goes; the rebalance one stays, equal share
    assert (excluded["gpus"], excluded["step"]) == (15, pytest.approx(A / 0.5 + M + C))
    weighted = run_policy("weighted", ranks, 16, A, M, C)
    # The slow rank gets half a share: it finishes before the healthy ones.
    assert weighted["gpus"] == 15 and weighted["step"] == pytest.approx((A + M) * 15 / 14.5 + C)
    assert weighted["throughput"] > excluded["throughput"] > ignore["throughput"]
