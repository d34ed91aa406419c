"""Fleet layout: which nodes hold which GPU model, in which rack, running which job, with the
job's step rhythm and its checkpoint and evaluation pauses. Everything here is drawn once from
the seed; the fleet's churn (bench/fleetgen/churn.py) is drawn on top of it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from random import Random

from bench.fleetgen.models import A100, H100, H200, Model
from bench.fleetgen.serving import Serving

NODES_PER_RACK = 4
WORKING = frozenset({"compute", "comm"})  # states in which a GPU does steady work
BUSY = WORKING | {"eval"}  # states in which a GPU's faults show (clock, thermal, error counters)


@dataclass
class Job:
    """A synchronous training job over some nodes: every GPU of it moves through the same
    phases at the same wall-clock instants (compute, communication, checkpoint and evaluation
    pauses)."""

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
    # Evaluation: forward passes only, below the power cap, little NVLink, almost no IB.
    eval_demand: float = 0.55
    eval_util: int = 75
    eval_nvlink: float = 0.05  # fraction of the communication phase's NVLink traffic
    pauses: list[tuple[float, float, str]] = field(default_factory=list)  # (start, end, "ckpt" | "eval"), sorted

    @property
    def cap_bound(self) -> bool:
        return self.compute_demand > 1.0

    @property
    def checkpoints(self) -> list[tuple[float, float]]:
        return [(a, b) for a, b, kind in self.pauses if kind == "ckpt"]

    @property
    def evals(self) -> list[tuple[float, float]]:
        return [(a, b) for a, b, kind in self.pauses if kind == "eval"]


@dataclass
class NodeSpec:
    idx: int
    name: str
    model: Model
    rack: str
    rack_offset: float  # inlet temperature offset of the rack, °C
    job: Job | None = None
    # When the node belongs to its job: a resize moves one end (joined later, left early).
    member: tuple[float, float] = (-math.inf, math.inf)
    appear: float = 0.0  # its first sample is at or after this offset (a node joining the fleet mid-run)
    gpu_reset: float | None = None  # GPU reset / driver reload: every NVML counter restarts from zero
    ib_reset: tuple[str, float] | None = None  # (port, offset): that port's counters restart from zero
    outage: tuple[float, float] | None = None  # its agent cannot push in this span; it spools
    gpus: int = 8  # GPUs of the node (all of its job's, like its ports)
    serving: Serving | None = None  # every GPU its own work (bench/fleetgen/serving.py), no job
    # Its share of its job's InfiniBand traffic: a pipeline-parallel job's first and last stages
    # send activations one way only, about half what its middle stages move (add_pipelines).
    ib_share: float = 1.0
    # (period, seed of the phases) of the refreshes its drivers serve byte counters from (cached.py);
    # None: read from the hardware at every sample.
    cached_counters: tuple[float, int] | None = None

    @property
    def partition(self) -> str:
        return self.model.key

    @property
    def span(self) -> tuple[float, float]:
        """When the node works for its job (empty without one)."""
        if self.job is None:
            return (math.inf, math.inf)
        return (max(self.job.start, self.member[0]), min(self.job.end, self.member[1]))

    def labels(self, off: float) -> dict[str, str]:
        labels = {"partition": self.partition, "rack": self.rack}
        if self.serving is not None and self.serving.name:
            labels["job"] = self.serving.name
        lo, hi = self.span
        if lo <= off < hi:
            labels["job"] = self.job.name
        return labels

    def in_pause(self, off: float, margin: float) -> bool:
        """Within `margin` seconds of a pause of its job or of the node's start or end in it."""
        lo, hi = self.span
        if off < lo + margin or off >= hi - margin:
            return True
        return any(a - margin <= off < b + margin for a, b, _ in self.job.pauses)

    def quiet(self) -> list[tuple[float, float]]:
        """Spans in which no fault may be injected: around a counter reset, the agent's outage."""
        out = [(t - 60.0, t + 120.0) for t in (self.gpu_reset, self.ib_reset and self.ib_reset[1]) if t is not None]
        if self.outage is not None:
            out.append(self.outage)
        return out


@dataclass
class Layout:
    nodes: list[NodeSpec]
    jobs: list[Job]


def make_layout(n_nodes: int, duration: float, rng: Random, *, gpus_per_node: int = 8) -> Layout:
    """Half H100, a quarter H200, a quarter A100 (contiguous blocks, as racks are bought);
    about one idle node in twelve; jobs of 3-6 nodes of one model, one job mixing A100 and
    H100 nodes. The churn (bench/fleetgen/churn.py) is drawn on top of it, from the same rng."""
    nodes = _racked_nodes(_models(n_nodes), rng)
    for node in nodes:
        node.gpus = gpus_per_node
    groups = _job_groups(nodes, _idle_nodes(nodes), rng)
    jobs = []
    for j, members in enumerate(groups):
        job = _job(f"train-{chr(ord('a') + j)}", members, duration, rng)
        jobs.append(job)
        for i in members:
            nodes[i].job = job
    return Layout(nodes, jobs)


def _models(n_nodes: int) -> list[Model]:
    if n_nodes < 4:
        return [H100] * n_nodes
    n_h100 = math.ceil(n_nodes * 0.5)
    n_h200 = round(n_nodes * 0.25)
    return [H100] * n_h100 + [H200] * n_h200 + [A100] * (n_nodes - n_h100 - n_h200)


def _racked_nodes(models: list[Model], rng: Random) -> list[NodeSpec]:
    """The nodes in racks of NODES_PER_RACK, each rack with its own inlet temperature offset."""
    racks: dict[int, float] = {}
    nodes = []
    for i, model in enumerate(models):
        r = i // NODES_PER_RACK
        if r not in racks:
            racks[r] = rng.uniform(-2.0, 2.5)
        nodes.append(NodeSpec(i, f"gpu-node-{i:03d}", model, f"r{r:02d}", racks[r]))
    return nodes


def _idle_nodes(nodes: list[NodeSpec]) -> set[int]:
    """About one node in twelve runs no job: the last of a model's block first."""
    n_nodes = len(nodes)
    if n_nodes < 6:
        return set()
    k_idle = max(1, round(n_nodes / 12))
    candidates = [n.idx for n in nodes if n.idx == n_nodes - 1 or nodes[n.idx + 1].model is not n.model]
    candidates += [n.idx for n in nodes if n.idx not in candidates and n.idx % 7 == 3]
    return set(candidates[:k_idle])


def _job_groups(nodes: list[NodeSpec], idle: set[int], rng: Random) -> list[list[int]]:
    """The nodes of each job: runs of 3-6 nodes of one model's block, then the mixed job."""
    blocks: dict[str, list[int]] = {}
    for n in nodes:
        if n.idx not in idle:
            blocks.setdefault(n.model.key, []).append(n.idx)
    mixed = _take_mixed(blocks)
    groups: list[list[int]] = []
    for key in ("h100", "h200", "a100"):
        members = blocks.get(key, [])
        while members:
            size = len(members) if len(members) <= 6 else rng.randint(3, min(6, len(members) - 3))
            groups.append(members[:size])
            members = members[size:]
    if mixed:
        groups.append(mixed)
    return groups


def _take_mixed(blocks: dict[str, list[int]]) -> list[int]:
    """The job mixing A100 and H100 nodes (the last two of each block), taken out of the
    blocks; none where the blocks are too small to spare them."""
    h100, a100 = blocks.get("h100", []), blocks.get("a100", [])
    if len(a100) >= 4 and len(h100) >= 5:
        blocks["h100"], blocks["a100"] = h100[:-2], a100[:-2]
        return h100[-2:] + a100[-2:]
    return []


def _job(name: str, members: list[int], duration: float, rng: Random) -> Job:
    # Log-uniform 1-20 s: at 5 s sampling most samples average over whole steps, at 1 s they
    # catch one phase or the other.
    period = math.exp(rng.uniform(0.0, math.log(20.0)))
    job = Job(
        name=name, nodes=list(members), start=0.0, end=math.inf, period=period,
        comm_frac=rng.uniform(0.15, 0.35), phase0=rng.uniform(0.0, period),
        # Most training jobs sit on the power cap (the routine SW power cap bit); a few lighter
        # ones run below it at full clock.
        compute_demand=rng.uniform(1.08, 1.22) if rng.random() < 0.85 else rng.uniform(0.72, 0.88),
        comm_demand=rng.uniform(0.5, 0.66), comm_util=rng.randint(72, 92),
        mem_util=rng.uniform(25.0, 55.0), mem_frac=rng.uniform(0.8, 0.94),
        nvlink_frac=rng.uniform(0.25, 0.45), nvlink_compute=rng.uniform(0.1, 0.3),
        ib_bps=rng.uniform(18e9, 36e9), ib_compute=rng.uniform(0.05, 0.2),
        wait_per_s=rng.uniform(1e5, 8e5), pcie_bps=rng.uniform(0.3e9, 3e9),
        eval_demand=rng.uniform(0.45, 0.65), eval_util=rng.randint(66, 85), eval_nvlink=rng.uniform(0.03, 0.1),
    )
    pauses(job, duration, rng)
    return job


def pauses(job: Job, duration: float, rng: Random) -> None:
    """A checkpoint every 10-20 min of 20-60 s in which every GPU of the job idles, and an
    evaluation every 15-40 min of 30-120 s, at least a minute away from any checkpoint."""
    horizon = min(job.end, duration)
    ckpts = []
    t = job.start + rng.uniform(300.0, 900.0)
    while t < horizon - 60:
        length = rng.uniform(20.0, 60.0)
        ckpts.append((round(t), round(t + length)))
        t += length + rng.uniform(600.0, 1200.0)
    evals = []
    t = job.start + rng.uniform(900.0, 2400.0)
    while True:
        length = rng.uniform(30.0, 120.0)
        for a, b in ckpts:  # move past any checkpoint it would touch
            if a - 60 < t + length and t < b + 60:
                t = b + 60.0
        if t >= horizon - length - 60:
            break
        evals.append((round(t), round(t + length)))
        t += length + rng.uniform(900.0, 2400.0)
    job.pauses = sorted([(a, b, "ckpt") for a, b in ckpts] + [(a, b, "eval") for a, b in evals])


PIPELINE_P = 0.5  # a job of 4+ nodes is pipeline-parallel, one stage per node
END_STAGE_SHARE = (0.5, 0.6)


def add_pipelines(nodes: list[NodeSpec], jobs: list[Job], rng: Random) -> None:
    """Some jobs are pipeline-parallel across their nodes: the first and last node (stage) of
    such a job move about half the InfiniBand bytes its middle stages do, for as long as the
    job runs. Drawn from its own stream: the rest of the fleet is the same with or without."""
    for job in jobs:
        if len(job.nodes) >= 4 and rng.random() < PIPELINE_P:
            share = rng.uniform(*END_STAGE_SHARE)
            for i in (job.nodes[0], job.nodes[-1]):
                nodes[i].ib_share = share
