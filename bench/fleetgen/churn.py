"""The fleet's churn, drawn on top of its layout: one job starting late and one ending early,
one job resized, one node joining the fleet mid-run, a GPU reset and an IB counter reset on
healthy nodes, and one agent that cannot push for a while. None of it is a fault: a detector
must take all of it in its stride. Each event gets a node of its own."""

from __future__ import annotations

import math
from collections.abc import Callable
from random import Random
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bench.fleetgen.layout import Job, NodeSpec


def add_churn(nodes: list[NodeSpec], jobs: list[Job], duration: float, rng: Random,
              repause: Callable[[Job], None]) -> None:
    if len(jobs) >= 3:
        late, early = jobs[1], jobs[2]
        late.start = round(duration * rng.uniform(0.3, 0.4))
        early.end = round(duration * rng.uniform(0.75, 0.85))
        for job in (late, early):
            repause(job)
    taken: set[int] = set()
    _resize(nodes, jobs, duration, rng, taken)
    # Small fleets keep every node from the start: a harness pushing a few nodes counts on it.
    if len(nodes) >= 6:
        _appear(nodes, jobs, duration, rng, taken)
    _gpu_reset(nodes, duration, rng, taken)
    _ib_reset(nodes, duration, rng, taken)
    _outage(nodes, duration, rng, taken)


def _single_model(nodes: list[NodeSpec], job: Job) -> bool:
    return len({nodes[i].model.key for i in job.nodes}) == 1


def _resize(nodes, jobs, duration, rng, taken) -> None:
    """An idle node joins a job that runs all along, or a node leaves one and idles."""
    stable = [j for j in jobs if j.start == 0 and j.end == math.inf and _single_model(nodes, j)]
    joins = [(n, j) for j in stable for n in nodes if n.job is None and n.model is nodes[j.nodes[0]].model]
    leaves = [(nodes[i], j) for j in stable if len(j.nodes) >= 3 for i in j.nodes]
    if not joins and not leaves:
        return
    if joins and (not leaves or rng.random() < 0.5):
        node, job = rng.choice(joins)
        node.job, node.member = job, (round(duration * rng.uniform(0.4, 0.6)), math.inf)
        job.nodes.append(node.idx)
    else:
        node, job = rng.choice(leaves)
        node.member = (-math.inf, round(duration * rng.uniform(0.45, 0.65)))
    taken.add(node.idx)


def _appear(nodes, jobs, duration, rng, taken) -> None:
    """A node back from repair: nothing from it until 15-25% of the way in, then it idles
    until its job (the late one) starts."""
    pool = [nodes[i] for j in jobs if j.start > 0 for i in j.nodes if i not in taken]
    pool = pool or [n for n in nodes if n.job is None and n.idx not in taken]
    if pool:
        node = rng.choice(pool)
        node.appear = round(duration * rng.uniform(0.15, 0.25))
        taken.add(node.idx)


def _idle_windows(node: NodeSpec, duration: float) -> list[tuple[float, float]]:
    """Spans of at least 4 minutes in which the node runs no job (a minute clear of it)."""
    lo, hi = max(node.appear, 0.1 * duration), 0.9 * duration
    start, end = node.span
    windows = [(lo, min(hi, start - 60.0)), (max(lo, end + 60.0), hi)]
    return [(a, b) for a, b in windows if b - a >= 240.0]


def _gpu_reset(nodes, duration, rng, taken) -> None:
    """A GPU reset / driver reload while the node idles (as a job epilog does): every NVML
    counter of its GPUs starts again from zero."""
    pool = [(n, w) for n in nodes if n.idx not in taken for w in _idle_windows(n, duration)]
    if pool:
        node, (a, b) = rng.choice(pool)
        node.gpu_reset = round(rng.uniform(a + 60.0, b - 120.0), 1)
        taken.add(node.idx)


def _ib_reset(nodes, duration, rng, taken) -> None:
    """Someone clears one port's counters (perfquery -R), busy or not."""
    pool = [n for n in nodes if n.idx not in taken and n.appear + 120.0 < 0.8 * duration]
    if pool:
        node = rng.choice(pool)
        lo = max(node.appear + 120.0, 0.2 * duration)
        node.ib_reset = (f"mlx5_{rng.randrange(8)}", round(rng.uniform(lo, 0.8 * duration), 1))
        taken.add(node.idx)


def _outage(nodes, duration, rng, taken) -> None:
    """An agent that cannot reach the collector for 5-10 minutes (a fifth of a short run): it
    keeps sampling into its spool and replays it afterwards."""
    pool = [n for n in nodes if n.idx not in taken]
    if pool:
        node = rng.choice(pool)
        start = max(node.appear + 120.0, duration * rng.uniform(0.3, 0.6))
        length = min(rng.uniform(300.0, 600.0), 0.2 * duration)
        if start + length < duration - 60.0:
            node.outage = (round(start, 1), round(start + length, 1))
            taken.add(node.idx)
