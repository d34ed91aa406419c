"""A pipeline-parallel job's first and last stages move about half the InfiniBand bytes of its
middle stages, for as long as the job runs (bench/fleetgen/layout.py add_pipelines). Found by a
probe fleet: every such end-stage node was a network straggler against the other nodes of its
job ("ports moving 5.3 GB/s per port vs 9.7 GB/s, the median of 3 other nodes of its group
(-45%)"), 8-10 false episodes an hour on 24 nodes, each lasting the job. A low figure another
node shares is now their work's (server/detect/across.py `shared_tol`)."""

from __future__ import annotations

from bench.fleetgen import Fleet, FleetConfig
from bench.judge import judge, samples_of


def test_the_end_stages_of_a_pipeline_are_no_stragglers():
    fleet = Fleet(FleetConfig(nodes=16, interval=5.0, duration=1800.0, seed=1, faults=False))
    ends = {n.name for n in fleet.layout.nodes if n.ib_share < 1.0}
    assert len(ends) >= 4, "no pipeline-parallel job: the test would prove nothing"
    episodes = judge(samples_of(fleet, 6))
    assert [(e["node"], e["cause"], e["summary"]) for e in episodes] == []


def test_pipelines_leave_the_rest_of_the_fleet_as_it_was():
    cfg = FleetConfig(nodes=16, interval=5.0, duration=600.0, seed=1)
    fleet, plain = Fleet(cfg), Fleet(FleetConfig(**{**cfg.__dict__, "pipelines": False}))
    assert fleet.truth == plain.truth
    middle = next(n.idx for n in fleet.layout.nodes if n.job is not None and n.ib_share == 1.0)
    end = next(n.idx for n in fleet.layout.nodes if n.ib_share < 1.0)
    assert fleet.node_samples(middle) == plain.node_samples(middle)
    moved = [[s["nics"][0]["tx_bytes_total"] for s in f.node_samples(end)] for f in (fleet, plain)]
    ratio = (moved[0][-1] - moved[0][0]) / (moved[1][-1] - moved[1][0])
    assert 0.45 < ratio < 0.65
