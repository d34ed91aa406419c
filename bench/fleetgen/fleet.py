"""A generated fleet: layout, sample times, ground truth, and its samples as protocol-v1
request bodies in the order a real fleet's pushes would reach the collector."""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from random import Random

from bench.fleetgen import cached
from bench.fleetgen.churn import add_churn
from bench.fleetgen.faults import Fault, schedule
from bench.fleetgen.layout import NODES_PER_RACK, Layout, NodeSpec, add_pipelines, make_layout, pauses
from bench.fleetgen.serving import describe as describe_serving
from bench.fleetgen.serving import make_serving, serving_count, serving_model
from bench.fleetgen.sim import NodeSim
from bench.fleetgen.timing import sample_times, send_plan

AGENT = {"version": "0.1.0", "driver": "550.54.15", "cuda": "12.4"}


@dataclass(frozen=True)
class FleetConfig:
    nodes: int = 24
    interval: float = 1.0  # seconds between two samples of a node
    duration: float = 3600.0  # seconds of sample time
    seed: int = 1
    t0: float = 1_764_662_400.0  # sampling starts here: each node's first sample lies in [t0, t0 + interval)
    cluster: str = "eval"
    faults: bool = True  # False: the same fleet (same layout, same noise) with nothing injected
    faults_per_cause: int = 6
    # Fewer than min_peers (cloud VMs of 1 or 2 GPUs, 4-GPU nodes): GPUs without peers inside
    # their node, judged only against other nodes.
    gpus_per_node: int = 8
    # True: every node samples on the grid t0 + k × interval and every node's batch is pushed
    # at once, round by round, with no agent outage (the kind fleets of old). The fleet's world
    # (jobs, pauses, churn, resets, faults) is the same either way.
    sync: bool = False
    # Nodes whose GPUs each run their own work (inference replicas, a sweep), beside the
    # training fleet (bench/fleetgen/serving.py): one per 8 nodes, none when False. Drawn from
    # their own random stream, so the training nodes and their faults are the same either way.
    serving: bool = True
    # Half the jobs of 4+ nodes pipeline-parallel, their end stages moving about half the
    # InfiniBand bytes (layout.py add_pipelines); none when False. Their own random stream too.
    pipelines: bool = True
    # A quarter of the nodes serve byte counters (NVLink, InfiniBand) as their driver last
    # refreshed them, every second or two (cached.py); none when False. Their own random stream too.
    cached_counters: bool = True

    @property
    def steps(self) -> int:
        return int(round(self.duration / self.interval))


@dataclass
class Fleet:
    cfg: FleetConfig
    layout: Layout = field(init=False)
    truth: list[Fault] = field(init=False)
    phases: list[float] = field(init=False)  # each node's sampling phase, seconds after t0
    times: list[list[float]] = field(init=False)  # each node's sample times (those before its first are never sent)
    first: list[int] = field(init=False)  # index of each node's first sample
    sims: list[NodeSim] = field(init=False)

    def __post_init__(self) -> None:
        cfg = self.cfg
        if cfg.interval <= 0 or cfg.duration < cfg.interval or cfg.nodes < 1:
            raise ValueError("need nodes >= 1 and duration >= interval > 0")
        rng = Random(f"{cfg.seed}:layout")
        self.layout = make_layout(cfg.nodes, cfg.duration, rng, gpus_per_node=cfg.gpus_per_node)
        add_churn(self.layout.nodes, self.layout.jobs, cfg.duration, rng, repause=lambda job: pauses(job, cfg.duration, rng))
        if cfg.pipelines:
            add_pipelines(self.layout.nodes, self.layout.jobs, Random(f"{cfg.seed}:pipelines"))
        training = Layout(list(self.layout.nodes), self.layout.jobs)
        if cfg.serving:
            self.layout.nodes += _serving_nodes(len(training.nodes), cfg, Random(f"{cfg.seed}:serving"))
        if cfg.cached_counters:
            for spec in self.layout.nodes:
                spec.cached_counters = cached.draw(cfg.seed, spec.idx)
        self.phases, self.times = [], []
        for spec in self.layout.nodes:
            phase, times = sample_times(cfg.t0, cfg.interval, cfg.steps, sync=cfg.sync, rng=Random(f"{cfg.seed}:clock:{spec.idx}"))
            self.phases.append(phase)
            self.times.append(times)
        self.first = [min(cfg.steps - 1, bisect_left(t, cfg.t0 + spec.appear)) for t, spec in zip(self.times, self.layout.nodes)]
        # The schedule is drawn whether or not faults are wanted, so a seed's fault-free
        # fleet is its faulty fleet minus the faults.
        truth = schedule(training, cluster=cfg.cluster, t0=cfg.t0, duration=cfg.duration, interval=cfg.interval,
                         faults_per_cause=cfg.faults_per_cause, rng=Random(f"{cfg.seed}:schedule"), times=self.times)
        self.truth = truth if cfg.faults else []
        self.sims = self._sims()

    def _sims(self) -> list[NodeSim]:
        cfg = self.cfg
        return [NodeSim(spec, seed=cfg.seed, cluster=cfg.cluster, t0=cfg.t0, interval=cfg.interval, duration=cfg.duration,
                        faults=self.truth, times=self.times[spec.idx]) for spec in self.layout.nodes]

    @property
    def t_end(self) -> float:
        """Sample time one interval after the last sample of any node (where its next would be)."""
        return max(t[-1] for t in self.times) + self.cfg.interval

    def bodies(self, samples_per_batch: int, nodes: Iterable[int] | None = None) -> Iterator[tuple[float, int, dict]]:
        """(send time, node index, v1 body) for the whole fleet (or these nodes), by send
        time: each node's batch goes out a moment after its last sample is taken (sync: round
        by round, node by node); the node whose agent is out replays its spool after the
        outage. Each node's samples are generated in time order (its state carries over); a
        fresh pass each call."""
        sims = self._sims()
        wanted = range(len(sims)) if nodes is None else nodes
        streams = [self._node_bodies(sims[i], samples_per_batch) for i in wanted]
        return heapq.merge(*streams, key=lambda item: (item[0], item[1]))

    def batches(self, samples_per_batch: int) -> Iterator[tuple[int, dict]]:
        """(node index, v1 body) in the order bodies() sends them."""
        for _send, idx, body in self.bodies(samples_per_batch):
            yield idx, body

    def node_samples(self, idx: int) -> list[dict]:
        """One node's samples, all of them in time order (a fresh pass)."""
        sim = self._sims()[idx]
        return [sim.sample(k) for k in range(self.first[idx], self.cfg.steps)]

    def _node_bodies(self, sim: NodeSim, per_batch: int) -> Iterator[tuple[float, int, dict]]:
        cfg, spec = self.cfg, sim.spec
        outage = None if cfg.sync or spec.outage is None else (cfg.t0 + spec.outage[0], cfg.t0 + spec.outage[1])
        plan = send_plan(sim.times, self.first[spec.idx], per_batch, sync=cfg.sync, outage=outage,
                         rng=Random(f"{cfg.seed}:send:{spec.idx}"))
        for k0, k1, send in plan:
            yield send, spec.idx, {
                "version": 1, "node": spec.name, "cluster": cfg.cluster,
                "labels": spec.labels(sim.times[k0] - cfg.t0), "agent": AGENT,
                "samples": [sim.sample(k) for k in range(k0, k1)],
            }

    def describe(self) -> str:
        lines = []
        for job in self.layout.jobs:
            models = sorted({self.layout.nodes[i].model.key for i in job.nodes})
            span = "" if job.start == 0 and job.end == math.inf else f", runs {job.start:.0f}-{min(job.end, self.cfg.duration):.0f} s"
            ends = [self.layout.nodes[i] for i in (job.nodes[0], job.nodes[-1])]
            pipeline = f", pipeline-parallel (end stages {ends[0].ib_share:.0%} of the IB bytes)" if ends[0].ib_share < 1.0 else ""
            lines.append(f"  {job.name}: {len(job.nodes)} nodes ({'+'.join(models)}){pipeline}, step {job.period:.1f} s, "
                         f"{'power-capped' if job.cap_bound else 'below cap'}, {len(job.checkpoints)} checkpoint and "
                         f"{len(job.evals)} evaluation pauses{span}")
        idle = [n.name for n in self.layout.nodes if n.job is None and n.serving is None]
        if idle:
            lines.append(f"  idle: {', '.join(idle)}")
        lines += [f"  {describe_serving(n.name, n.serving)}" for n in self.layout.nodes if n.serving is not None]
        events = [e for n in self.layout.nodes for e in _events(n)]
        if events:
            lines.append(f"  churn: {'; '.join(events)}")
        lines.append("  sampling: " + ("synchronised grid, pushed round by round" if self.cfg.sync else
                                      "per-node phase and jitter, pushed as each batch fills"))
        return "\n".join(lines)


def _serving_nodes(first: int, cfg: FleetConfig, rng: Random) -> list[NodeSpec]:
    """The serving nodes, numbered after the training fleet's, in racks of their own."""
    out = []
    rack0 = (first + NODES_PER_RACK - 1) // NODES_PER_RACK
    for k in range(serving_count(first)):
        idx = first + k
        spec = NodeSpec(idx, f"gpu-node-{idx:03d}", serving_model(k), f"r{rack0 + k // NODES_PER_RACK:02d}", rng.uniform(-2.0, 2.5),
                        gpus=cfg.gpus_per_node)
        spec.serving = make_serving(k, spec.gpus, cfg.duration, rng)
        out.append(spec)
    return out


def _events(n: NodeSpec) -> list[str]:
    out = []
    if n.member[0] > -math.inf:
        out.append(f"{n.name} joins {n.job.name} at {n.member[0]:.0f} s")
    if n.member[1] < math.inf:
        out.append(f"{n.name} leaves {n.job.name} at {n.member[1]:.0f} s")
    if n.appear > 0:
        out.append(f"{n.name} first reports at {n.appear:.0f} s")
    if n.gpu_reset is not None:
        out.append(f"{n.name} GPU reset at {n.gpu_reset:.0f} s")
    if n.ib_reset is not None:
        out.append(f"{n.name} {n.ib_reset[0]} counters cleared at {n.ib_reset[1]:.0f} s")
    if n.outage is not None:
        out.append(f"{n.name} agent cannot push {n.outage[0]:.0f}-{n.outage[1]:.0f} s")
    return out
