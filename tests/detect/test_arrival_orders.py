"""Determinism (#13 item 3): the same samples pushed in four arrival orders give identical
episodes (entity, cause, onset, detection, resolution, severity). The fleet is bench/fleetgen's
realistic default (every node at its own sampling phase, jitter, counters integrated over the
job's phases, pauses, churn, resets, an agent outage), big enough to hold faults of every
cause; the orders are bench/judge.py's, fed to the detector engine in-process."""

from __future__ import annotations

import pytest

from bench.detection import score
from bench.fleetgen import CAUSES, Fleet, FleetConfig
from bench.judge import identity, instant_by_instant, judge, node_by_node, one_node_held_back, random_batches, samples_of


@pytest.fixture(scope="module")
def fleet_bodies():
    fleet = Fleet(FleetConfig(nodes=16, interval=5.0, duration=2700.0, seed=11, faults_per_cause=2))
    assert {f.cause for f in fleet.truth} == set(CAUSES), "the fleet must hold faults of every cause"
    bodies = samples_of(fleet, 6)
    episodes = judge(instant_by_instant(bodies))
    return fleet, bodies, episodes


def test_instant_by_instant_finds_the_faults(fleet_bodies):
    fleet, _, episodes = fleet_bodies
    # An order test on a fleet where nothing is found would prove nothing (the detection
    # figures themselves are bench/detection.py's business).
    scored = score(fleet.truth, episodes, interval=fleet.cfg.interval, grace=120.0)["overall"]
    assert scored["recall"] >= 0.9 and scored["precision"] >= 0.9, scored
    assert {e["cause"] for e in episodes} == set(CAUSES)


@pytest.fixture(scope="module")
def small_node_bodies():
    """Nodes of two GPUs: every GPU is judged against other nodes, over windows aligned across
    them, which wait for late nodes (not one node's samples judged against whoever came first)."""
    fleet = Fleet(FleetConfig(nodes=24, interval=5.0, duration=2700.0, seed=3, faults_per_cause=4, gpus_per_node=2))
    bodies = samples_of(fleet, 6)
    episodes = judge(instant_by_instant(bodies))
    assert sum(e["entity"].endswith("/across") for e in episodes) >= 3, "the fleet must hold findings across nodes"
    return fleet, bodies, episodes


ORDERS = ["node by node in 10-minute blocks", "one node held back 10 minutes", "random batches up to 5 minutes late"]


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("which", ["fleet_bodies", "small_node_bodies"])
def test_arrival_order_gives_identical_episodes(request, which, order):
    fleet, bodies, episodes = request.getfixturevalue(which)
    nodes = sorted({b["node"] for b in bodies})
    arranged = {
        "node by node in 10-minute blocks": lambda: node_by_node(bodies),
        "one node held back 10 minutes": lambda: one_node_held_back(bodies, nodes[len(nodes) // 3]),
        "random batches up to 5 minutes late": lambda: random_batches(bodies, seed=5),
    }[order]()
    assert [identity(e) for e in judge(arranged)] == [identity(e) for e in episodes]
