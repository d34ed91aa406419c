"""GPUs that share a model and a label but not their work (inference replicas of 1, 2 or 4 GPUs,
a sweep run per GPU: bench/fleetgen/serving.py) are not stragglers of each other. The busiest
sits on the power cap at a lower clock while the others run below it at full clock; a
tensor-parallel replica with fewer requests moves less over NVLink than the others, a
single-GPU replica nothing at all. Found by a probe fleet: three such nodes beside 24 training
nodes drew 94-115 power episodes an hour at 1 s (43-52 at 5 s), then, with their replicas
talking over NVLink, 21-79 NVLink episodes, every one false."""

from __future__ import annotations

import pytest

from bench.fleetgen import Fleet, FleetConfig
from bench.fleetgen.models import SW_POWER_CAP
from bench.judge import judge, samples_of


@pytest.fixture(scope="module")
def fleet() -> Fleet:
    # Seed 3: replicas of 4+2+1+1 GPUs on one serving node, 4+1+1+1+1 on the other.
    return Fleet(FleetConfig(nodes=16, interval=5.0, duration=1800.0, seed=3, faults=False))


def test_the_fleet_holds_gpus_that_share_a_label_but_not_their_work(fleet):
    serving = [n for n in fleet.layout.nodes if n.serving is not None]
    assert serving, "no serving node: the test below would prove nothing"
    samples = fleet.node_samples(serving[0].idx)
    # At many instants some busy GPUs are on the cap and others run below it.
    mixed = sum(1 for s in samples
                if {bool(g["clocks_event_reasons"] & SW_POWER_CAP) for g in s["gpus"] if g["util_gpu_pct"] >= 10} == {True, False})
    assert mixed >= len(samples) // 4
    # Replicas of several GPUs move bytes over NVLink, single-GPU ones none.
    assert {len(set(n.serving.replica_of)) for n in serving} == {4, 5}


def test_no_episode_on_a_node_whose_gpus_each_do_their_own_work(fleet):
    serving = {n.name for n in fleet.layout.nodes if n.serving is not None}
    episodes = judge(samples_of(fleet, 6))
    assert [(e["node"], e["gpu"], e["cause"], e["summary"]) for e in episodes if e["node"] in serving] == []
