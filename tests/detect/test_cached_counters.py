"""Ports and GPUs whose drivers serve byte counters refreshed every second or two, each device
on its own phase (bench/fleetgen/cached.py), sampled every second: a port reads 0 when a
refresh drifts past the agent's sample (or at every other sample), then twice its traffic.
Not a slow port. Before the rates of byte counters were held (server/detect/observe.py
held_rate), this fleet drew 28 false `network` and `nvlink` episodes in 15 minutes."""

from __future__ import annotations

import pytest

from bench.fleetgen import Fleet, FleetConfig
from bench.judge import judge, samples_of


@pytest.fixture(scope="module")
def fleet() -> Fleet:
    return Fleet(FleetConfig(nodes=16, interval=1.0, duration=900.0, seed=2, faults=False))


def _zero_reads(fleet: Fleet, idx: int) -> int:
    """Samples at which one of the node's ports, busy, moved nothing since the one before."""
    zeros, prev = 0, None
    for s in fleet.node_samples(idx):
        now = {n["device"]: n["tx_bytes_total"] for n in s["nics"]}
        busy = any(g.get("util_gpu_pct", 0) >= 50 for g in s["gpus"])
        if prev is not None and busy:
            zeros += sum(1 for d, v in now.items() if v == prev.get(d))
        prev = now
    return zeros


def test_the_fleet_has_ports_that_read_0_between_refreshes(fleet):
    cached = [n.idx for n in fleet.layout.nodes if n.cached_counters is not None]
    plain = [n.idx for n in fleet.layout.nodes if n.cached_counters is None and n.job is not None]
    assert cached and plain
    assert sum(_zero_reads(fleet, i) for i in cached) >= 20
    assert sum(_zero_reads(fleet, i) for i in plain[:4]) == 0


def test_no_episode_on_a_fleet_whose_counters_are_refreshed_every_second_or_two(fleet):
    episodes = judge(samples_of(fleet, 30))
    assert [(e["node"], e["gpu"], e["cause"], e["summary"]) for e in episodes] == []


def test_a_checkpoint_between_two_late_refreshes_makes_no_row():
    """At 5 s a port whose driver refreshes every 2 s reads low, high, low for minutes (two or
    three refreshes an interval). Its low reading before a checkpoint and the first after it,
    with the idle instants between skipped, counted as two in a row: a false `network` episode
    (one HTTP run in fourteen, whose fleet started at this t0; bench/detection.py starts its
    fleets at the minute before now, so the refreshes' phase against the samples varies)."""
    fleet = Fleet(FleetConfig(nodes=24, interval=5.0, duration=3600.0, seed=1, gpus_per_node=2, faults=False, t0=1796679060.0,
                              cluster="eval-5s-clean"))
    episodes = judge(samples_of(fleet, 6))
    assert [(e["node"], e["gpu"], e["cause"], e["summary"]) for e in episodes] == []
