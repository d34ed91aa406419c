"""Fleet layout: which nodes hold which GPU model, in which rack, running which job, with the
job's phase rhythm and checkpoint pauses. Everything here is drawn once from the seed."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from random import Random

from bench.fleetgen.models import A100, H100, H200, Model

NODES_PER_RACK = 4
WORKING = frozenset({"compute", "comm"})  # states in which a GPU does steady work


@dataclass
class Job:
    """A synchronous training job over some nodes: every GPU of it moves through the same
    phases at the same instants (compute, communication, checkpoint pauses)."""

    name: str
    nodes: list[int]
    start: float  # seconds after t0
    end: float
    period: float  # one training step: compute then communication
    comm_frac: float
    phase0: float
    compute_demand: float  # power the step's compute phase would draw at max clock, × power limit
    comm_demand: float
    comm_util: int
    mem_util: float
    mem_frac: float
    nvlink_frac: float  # communication-phase NVLink traffic, fraction of the model's peak
    nvlink_compute: float  # compute-phase traffic as a fraction of the communication phase's
    ib_bps: float  # per port, tx + rx, communication phase
    ib_compute: float
    wait_per_s: float  # port_xmit_wait ticks per second, communication phase
    pcie_bps: float
    checkpoints: list[tuple[float, float]] = field(default_factory=list)

    @property
    def cap_bound(self) -> bool:
        return self.compute_demand > 1.0

    def state(self, off: float, dt: float) -> str:
        """What the job's GPUs do at `off` seconds after t0, seen by a sample every `dt` s.

        off / compute / comm / ckpt (paused: idle bit, idle clocks) / ckpt_in (the sample in
        which the pause began: part-busy utilisation, clocks already down) / ckpt_out (the
        sample in which work resumed, also the job's first sample)."""
        if off < self.start or off >= self.end:
            return "off"
        if off - dt < self.start:
            return "ckpt_out"
        for a, b in self.checkpoints:
            if a <= off < b:
                return "ckpt_in" if off - dt < a else "ckpt"
            if b <= off < b + dt:
                return "ckpt_out"
        ph = (off - self.start - self.phase0) % self.period
        return "compute" if ph < self.period * (1.0 - self.comm_frac) else "comm"

    def in_pause(self, off: float, margin: float) -> bool:
        """Within `margin` seconds of a checkpoint pause or of the job's start or end."""
        if off < self.start + margin or off >= self.end - margin:
            return True
        return any(a - margin <= off < b + margin for a, b in self.checkpoints)


@dataclass
class NodeSpec:
    idx: int
    name: str
    model: Model
    rack: str
    rack_offset: float  # inlet temperature offset of the rack, °C
    job: Job | None = None

    @property
    def partition(self) -> str:
        return self.model.key

    def labels(self, off: float) -> dict[str, str]:
        labels = {"partition": self.partition, "rack": self.rack}
        if self.job is not None and self.job.start <= off < self.job.end:
            labels["job"] = self.job.name
        return labels


@dataclass
class Layout:
    nodes: list[NodeSpec]
    jobs: list[Job]


def make_layout(n_nodes: int, duration: float, rng: Random) -> Layout:
    """Half H100, a quarter H200, a quarter A100 (contiguous blocks, as racks are bought);
    about one idle node in twelve; jobs of 3-6 nodes of one model, one job mixing A100 and
    H100 nodes; one job starting a third of the way in, one ending early."""
    if n_nodes < 4:
        models = [H100] * n_nodes
    else:
        n_h100 = math.ceil(n_nodes * 0.5)
        n_h200 = round(n_nodes * 0.25)
        models = [H100] * n_h100 + [H200] * n_h200 + [A100] * (n_nodes - n_h100 - n_h200)
    racks: dict[int, float] = {}
    nodes = []
    for i, model in enumerate(models):
        r = i // NODES_PER_RACK
        if r not in racks:
            racks[r] = rng.uniform(-2.0, 2.5)
        nodes.append(NodeSpec(i, f"gpu-node-{i:03d}", model, f"r{r:02d}", racks[r]))

    idle: set[int] = set()
    if n_nodes >= 6:
        k_idle = max(1, round(n_nodes / 12))
        candidates = [n.idx for n in nodes if n.idx == n_nodes - 1 or nodes[n.idx + 1].model is not n.model]
        candidates += [n.idx for n in nodes if n.idx not in candidates and n.idx % 7 == 3]
        idle = set(candidates[:k_idle])

    blocks: dict[str, list[int]] = {}
    for n in nodes:
        if n.idx not in idle:
            blocks.setdefault(n.model.key, []).append(n.idx)
    groups: list[list[int]] = []
    h100, a100 = blocks.get("h100", []), blocks.get("a100", [])
    if len(a100) >= 4 and len(h100) >= 5:
        mixed = h100[-2:] + a100[-2:]
        blocks["h100"], blocks["a100"] = h100[:-2], a100[:-2]
    else:
        mixed = []
    for key in ("h100", "h200", "a100"):
        members = blocks.get(key, [])
        while members:
            size = len(members) if len(members) <= 6 else rng.randint(3, min(6, len(members) - 3))
            groups.append(members[:size])
            members = members[size:]
    if mixed:
        groups.append(mixed)

    jobs = []
    for j, members in enumerate(groups):
        job = _job(f"train-{chr(ord('a') + j)}", members, duration, rng)
        jobs.append(job)
        for i in members:
            nodes[i].job = job
    # Churn: one job starts late (its nodes idle until then), one ends early.
    if len(jobs) >= 3:
        late, early = jobs[1], jobs[2]
        late.start = round(duration * rng.uniform(0.3, 0.4))
        early.end = round(duration * rng.uniform(0.75, 0.85))
        for job in (late, early):
            _checkpoints(job, duration, rng)
    return Layout(nodes, jobs)


def _job(name: str, members: list[int], duration: float, rng: Random) -> Job:
    period = rng.uniform(6.0, 24.0)
    job = Job(
        name=name, nodes=members, start=0.0, end=math.inf, period=period,
        comm_frac=rng.uniform(0.15, 0.35), phase0=rng.uniform(0.0, period),
        # Most training jobs sit on the power cap (the routine SW power cap bit); a few lighter
        # ones run below it at full clock.
        compute_demand=rng.uniform(1.08, 1.22) if rng.random() < 0.85 else rng.uniform(0.72, 0.88),
        comm_demand=rng.uniform(0.5, 0.66), comm_util=rng.randint(72, 92),
        mem_util=rng.uniform(25.0, 55.0), mem_frac=rng.uniform(0.8, 0.94),
        nvlink_frac=rng.uniform(0.25, 0.45), nvlink_compute=rng.uniform(0.1, 0.3),
        ib_bps=rng.uniform(18e9, 36e9), ib_compute=rng.uniform(0.05, 0.2),
        wait_per_s=rng.uniform(1e5, 8e5), pcie_bps=rng.uniform(0.3e9, 3e9),
    )
    _checkpoints(job, duration, rng)
    return job


def _checkpoints(job: Job, duration: float, rng: Random) -> None:
    """A pause every 10-20 min of 20-60 s in which every GPU of the job idles."""
    job.checkpoints = []
    t = job.start + rng.uniform(300.0, 900.0)
    horizon = min(job.end, duration)
    while t < horizon - 60:
        length = rng.uniform(20.0, 60.0)
        job.checkpoints.append((round(t), round(t + length)))
        t += length + rng.uniform(600.0, 1200.0)
