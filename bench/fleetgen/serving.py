"""Nodes that serve rather than train: every GPU runs its own, unsynchronised work (an
inference replica per GPU, a hyperparameter sweep of single-GPU runs), so GPUs of one model on
one node are busy side by side yet do different work. Real clusters hold such nodes next to
their training jobs; a detector that compares whatever GPUs share a model and a label must
not take the busier one for a straggler.

The node's GPUs are split into replicas of 1, 2 or 4 GPUs (tensor parallel over NVLink when
more than one; a single-GPU replica moves nothing over NVLink). Each replica's load is a level
in [0, 1] that holds for a while (exponentially distributed, LEVEL_HOLD_S on average) and then
jumps to a new one: mostly 0.3-1.0 (requests queued), now and then near zero (a quiet
replica: below the busy threshold). Power and NVLink traffic follow the level; power hits the
cap at the top of it (the SW power cap bit, the clock down a little), as a heavy inference
batch does. Half the serving nodes carry a job label (one Slurm job or Kubernetes
deployment holding the node), half only their partition: both are what an agent reports when
it cannot attribute each GPU's processes to a workload of its own.

No fault is injected on a serving node: its GPUs have no peers doing the same work, so what a
comparison could find there is what the fault-free fleet measures (its false flags)."""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from random import Random

from bench.fleetgen.models import A100, H100, Model

LEVEL_HOLD_S = 60.0
QUIET_P = 0.12  # a new level is a quiet one (util below the busy threshold)
SERVE_NODES_PER = 8  # one serving node per this many training-fleet nodes (none below 8)


REPLICA_SIZES = ((1, 1, 1, 1, 1, 1, 1, 1), (2, 2, 2, 2), (4, 4), (4, 2, 1, 1), (2, 2, 1, 1, 1, 1), (4, 1, 1, 1, 1))


@dataclass(frozen=True)
class Serving:
    """What a serving node's GPUs do: each GPU's replica; per replica, (change times, levels)
    with levels[i] holding from times[i] on and its NVLink traffic at full load (fraction of
    the model's peak, 0 for one GPU); each GPU's share of memory (weights and KV cache)."""

    name: str  # the job label, or "" where the node carries only its partition
    replica_of: tuple[int, ...]
    changes: tuple[tuple[tuple[float, ...], tuple[float, ...]], ...]
    nvlink: tuple[float, ...]
    mem_frac: tuple[float, ...]

    def level(self, gpu: int, off: float) -> float:
        times, levels = self.changes[self.replica_of[gpu]]
        return levels[max(0, bisect_right(times, off) - 1)]

    def nvlink_frac(self, gpu: int) -> float:
        return self.nvlink[self.replica_of[gpu]]


def serving_count(n_nodes: int) -> int:
    return n_nodes // SERVE_NODES_PER


def serving_model(k: int) -> Model:
    """H100, A100, H100, ...: beside training nodes of the same model and partition."""
    return A100 if k % 2 else H100


def make_serving(k: int, gpus: int, duration: float, rng: Random) -> Serving:
    sizes = rng.choice(REPLICA_SIZES) if gpus == 8 else (1,) * gpus
    replica_of = tuple(r for r, size in enumerate(sizes) for _ in range(size))
    changes = []
    for _ in sizes:
        times, levels, t = [], [], 0.0
        while t < duration:
            times.append(t)
            levels.append(rng.uniform(0.0, 0.06) if rng.random() < QUIET_P else rng.uniform(0.3, 1.0))
            t += rng.expovariate(1.0 / LEVEL_HOLD_S)
        changes.append((tuple(times), tuple(levels)))
    name = f"serve-{chr(ord('a') + k)}" if k % 2 == 0 else ""
    nvlink = tuple(0.0 if size == 1 else rng.uniform(0.1, 0.3) for size in sizes)
    return Serving(name, replica_of, tuple(changes), nvlink, tuple(rng.uniform(0.5, 0.92) for _ in range(gpus)))


def demand(level: float) -> float:
    """Power the GPU would draw at max clock, × its power limit: a full batch tops the cap."""
    return 0.22 + 0.98 * level


def describe(name: str, serving: Serving) -> str:
    label = f"job label {serving.name}" if serving.name else "partition label only"
    sizes = [serving.replica_of.count(r) for r in range(len(serving.changes))]
    return f"{name}: serving, replicas of {'+'.join(map(str, sizes))} GPUs, each its own load ({label})"

