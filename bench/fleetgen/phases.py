"""A job's timeline as one of its nodes sees it: what its GPUs do at a sample's instant (what
NVML gauges report) and how long they spent in each state since the node's previous sample
(what counters accumulate). Offsets are seconds after t0.

Counters are integrals: bytes moved over an interval are the time spent in each state times
that state's rate, so a 5 s sample over 1 s steps carries the step's average, and an interval
that straddles a pause edge carries part of each side."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bench.fleetgen.layout import Job, NodeSpec

# Indices of occupancy()'s tuple.
OFF, COMPUTE, COMM, CKPT, EVAL = range(5)


def state(spec: NodeSpec, off: float, prev: float) -> str:
    """What the node's GPUs do at `off`, sampled last at `prev`.

    off / compute / comm / eval / ckpt (paused: idle bit, idle clocks) / ckpt_in (the sample
    in which the checkpoint began: part-busy utilisation, clocks already down) / ckpt_out (the
    sample in which work resumed, also the node's first sample in its job)."""
    job = spec.job
    lo, hi = spec.span
    if job is None or off < lo or off >= hi:
        return "off"
    if prev < lo and lo > 0:  # a job with start 0 was running before the first sample
        return "ckpt_out"
    for a, b, kind in job.pauses:
        if a > off:
            break
        if off < b:
            if kind == "eval":
                return "eval"
            return "ckpt_in" if prev < a else "ckpt"
        if kind == "ckpt" and prev < b:
            return "ckpt_out"
    ph = (off - job.start - job.phase0) % job.period
    return "compute" if ph < job.period * (1.0 - job.comm_frac) else "comm"


def _comm_until(job: Job, t: float) -> float:
    """Seconds of communication phase between the job's phase origin and `t`, pauses ignored."""
    x = t - job.start - job.phase0
    n = math.floor(x / job.period)
    comm = job.period * job.comm_frac
    return n * comm + max(0.0, x - n * job.period - (job.period - comm))


def occupancy(spec: NodeSpec, a: float, b: float) -> tuple[float, float, float, float, float]:
    """Seconds the node's GPUs spent off / computing / communicating / checkpointing /
    evaluating within [a, b]."""
    total = b - a
    job = spec.job
    lo, hi = spec.span
    lo, hi = max(a, lo), min(b, hi)
    if job is None or hi <= lo:
        return (total, 0.0, 0.0, 0.0, 0.0)
    ckpt = evals = 0.0
    comm = _comm_until(job, hi) - _comm_until(job, lo)
    for p0, p1, kind in job.pauses:
        if p0 >= hi:
            break
        if p1 <= lo:
            continue
        x0, x1 = max(p0, lo), min(p1, hi)
        comm -= _comm_until(job, x1) - _comm_until(job, x0)
        if kind == "ckpt":
            ckpt += x1 - x0
        else:
            evals += x1 - x0
    working = max(0.0, hi - lo - ckpt - evals)
    comm = min(max(comm, 0.0), working)
    return (total - (hi - lo), working - comm, comm, ckpt, evals)


def nvlink_rates(spec: NodeSpec) -> tuple[float, ...]:
    """Bytes/s per GPU and direction in each state of occupancy()."""
    job, m = spec.job, spec.model
    if job is None:
        return (0.0,) * 5
    comm = m.nvlink_peak * job.nvlink_frac
    return (0.0, comm * job.nvlink_compute, comm, 0.0, comm * job.eval_nvlink)


def ib_rates(spec: NodeSpec) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(bytes/s tx + rx, port_xmit_wait ticks/s) per port in each busy state (the node's share
    of its job's: a pipeline's end stages move less); an idle port's trickle is drawn per sample."""
    job = spec.job
    if job is None:
        return (0.0,) * 5, (0.0,) * 5
    # A checkpoint's writes go to storage over the fabric at a trickle; an evaluation barely
    # talks to the other nodes.
    bps, wait = job.ib_bps * spec.ib_share, job.wait_per_s * spec.ib_share
    return (0.0, bps * job.ib_compute, bps, bps * 0.02, bps * 0.002), (0.0, wait * 0.1, wait, wait * 0.01, wait * 0.001)


def dot(occ: tuple[float, ...], rates: tuple[float, ...]) -> float:
    return occ[0] * rates[0] + occ[1] * rates[1] + occ[2] * rates[2] + occ[3] * rates[3] + occ[4] * rates[4]
