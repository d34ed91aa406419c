"""A generated fleet: layout, ground truth, and its samples as protocol-v1 request bodies in
the order a real fleet would send them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from random import Random

from bench.fleetgen.faults import Fault, schedule
from bench.fleetgen.layout import Layout, make_layout
from bench.fleetgen.sim import NodeSim

AGENT = {"version": "0.1.0", "driver": "550.54.15", "cuda": "12.4"}


@dataclass(frozen=True)
class FleetConfig:
    nodes: int = 24
    interval: float = 1.0  # seconds between samples
    duration: float = 3600.0  # seconds of sample time
    seed: int = 1
    t0: float = 1_764_662_400.0  # sample time of the first sample
    cluster: str = "eval"
    faults: bool = True  # False: the same fleet (same layout, same noise) with nothing injected
    faults_per_cause: int = 6

    @property
    def steps(self) -> int:
        return int(round(self.duration / self.interval))


@dataclass
class Fleet:
    cfg: FleetConfig
    layout: Layout = field(init=False)
    truth: list[Fault] = field(init=False)
    sims: list[NodeSim] = field(init=False)

    def __post_init__(self) -> None:
        cfg = self.cfg
        if cfg.interval <= 0 or cfg.duration < cfg.interval or cfg.nodes < 1:
            raise ValueError("need nodes >= 1 and duration >= interval > 0")
        self.layout = make_layout(cfg.nodes, cfg.duration, Random(f"{cfg.seed}:layout"))
        # The schedule is drawn whether or not faults are wanted, so a seed's fault-free
        # fleet is its faulty fleet minus the faults.
        truth = schedule(self.layout, cluster=cfg.cluster, t0=cfg.t0, duration=cfg.duration, interval=cfg.interval,
                         faults_per_cause=cfg.faults_per_cause, rng=Random(f"{cfg.seed}:schedule"))
        self.truth = truth if cfg.faults else []
        self.sims = [NodeSim(spec, seed=cfg.seed, cluster=cfg.cluster, t0=cfg.t0, interval=cfg.interval,
                             duration=cfg.duration, faults=self.truth) for spec in self.layout.nodes]

    @property
    def t_end(self) -> float:
        """Sample time just after the last sample."""
        return self.cfg.t0 + self.cfg.steps * self.cfg.interval

    def batches(self, samples_per_batch: int) -> Iterator[tuple[int, dict]]:
        """(node index, v1 body) for the whole fleet: every node's first batch, then every
        node's second, and so on, so sample time advances together across the fleet. Each
        node's samples are generated in time order (its state carries over)."""
        cfg = self.cfg
        for k0 in range(0, cfg.steps, samples_per_batch):
            k1 = min(cfg.steps, k0 + samples_per_batch)
            for sim in self.sims:
                samples = [sim.sample(k) for k in range(k0, k1)]
                yield sim.spec.idx, {
                    "version": 1, "node": sim.spec.name, "cluster": cfg.cluster,
                    "labels": sim.spec.labels(k0 * cfg.interval), "agent": AGENT, "samples": samples,
                }

    def describe(self) -> str:
        lines = []
        for job in self.layout.jobs:
            models = sorted({self.layout.nodes[i].model.key for i in job.nodes})
            span = "" if job.start == 0 and job.end == float("inf") else f", runs {job.start:.0f}-{min(job.end, self.cfg.duration):.0f} s"
            lines.append(f"  {job.name}: {len(job.nodes)} nodes ({'+'.join(models)}), step {job.period:.1f} s, "
                         f"{'power-capped' if job.cap_bound else 'below cap'}, {len(job.checkpoints)} checkpoint pauses{span}")
        idle = [n.name for n in self.layout.nodes if n.job is None]
        if idle:
            lines.append(f"  idle: {', '.join(idle)}")
        return "\n".join(lines)
