"""Nodes against nodes, over windows aligned across them: what the comparison inside a node
cannot see — a whole node moving less than the other nodes of its job (an NVSwitch tray, a
leaf switch, a lower power limit on every GPU), or a node with too few GPUs of a peer group
for peers of its own.

Nodes sample at their own phases, so no two nodes' samples are simultaneous. Counters are
therefore compared over common windows [B - W, B] whose boundaries are multiples of W in
sample time, the same for every node: each GPU's (or port's) counter is interpolated linearly
at both boundaries between the samples around them (its per-interval rate integrated over the
part of each interval inside the window), as Prometheus' rate() does over a range. With W many
sampling intervals long, the error interpolation makes inside one interval is a small part of
the window, whatever a node's phase. Gauges are not compared across nodes: a clock read in a
compute phase and one read in a communication phase differ by design (the power cap), and no
interpolation fixes that; power limits are settings, not readings, and are, and so is the
free clock (a busy GPU's clock with no reason holding it down: its boost clock at any moment),
for GPUs of nodes too small to compare them inside (server/detect/across_window.py).

A node takes part in a window only if steady: every GPU of the group busy at every sample
inside the window (a checkpoint, an evaluation, a job starting or resizing make a group
unsteady for the windows they touch), every counter readable (no reset inside).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import median

from server.detect.model import Robust, Window, ts_of
from server.detect.rules._common import VsPeers


@dataclass(frozen=True, slots=True)
class NodeValue:
    """One unit compared with the others: a node (the median over its members, GPUs or ports,
    of the group), or one GPU of a node with fewer than min_peers of the group (`gpu`: its
    uuid and index), whose one slow GPU the median of two would halve."""

    node: str
    value: float
    members: int
    gpu: tuple[str, int] | None = None
    judged: bool = True  # False: part of the others' reference only


def aligned_mean_rate(window: Window, attr: str, start: float, end: float, *, steady: str = "busy") -> float | None:
    """The counter's mean rate over [start, end], its value interpolated at both ends; None
    when the samples do not cover the whole span, a rate inside is unknown (a reset), or an
    observation inside is not steady (its `steady` attribute false: a GPU not busy, a port
    of a node not busy)."""
    items = window.items
    if len(items) < 2 or items[-1].ts < end:
        return None
    # The first sample after `start`: the intervals before it end before the window. Without a
    # sample at or before `start` the window is not covered.
    first = bisect_right(items, start, key=ts_of)
    if first == 0:
        return None
    total, prev_ts = 0.0, items[first - 1].ts
    for obs in items[first:]:
        rate = getattr(obs, attr)
        if rate is None or not getattr(obs, steady):
            return None
        total += rate * (min(obs.ts, end) - max(prev_ts, start))
        if obs.ts >= end:
            break
        prev_ts = obs.ts
    return total / (end - start)


def node_value(node: str, rates: Sequence[float | None]) -> NodeValue | None:
    """A node's figure: the median of its members, if every member could be measured, or all but
    one of four or more (a port down, a GPU lost: that is found inside the node; while the whole
    node sat out, a pipeline's end stage whose partner had a port down was flagged, alone)."""
    known = [r for r in rates if r is not None]
    if not known or len(known) < len(rates) - (1 if len(rates) >= 4 else 0):
        return None
    return NodeValue(node, median(known), len(known))


def against_other_nodes(values: Iterable[NodeValue], *, min_nodes: int, min_median: float, drop: float, z_min: float,
                        noise_floor: float, shared_tol: float | None = None) -> dict[NodeValue, tuple[VsPeers, Robust]]:
    """Each unit (a node, or a GPU of a node too small for a figure of its own) against the
    median of the *others* (one odd unit never moves its own reference); a unit is low when
    drop below it and z_min robust deviations under it, and, with `shared_tol`, no unit of
    another node within shared_tol × that median of it (a figure two nodes share is their
    work's: the two ends of a pipeline move half the bytes of its middle stages).

    A job of 12,500 nodes is one group: the others' median and MAD are read off the sorted
    values by rank (leave_one_out), not sorted again for every node (that was minutes of CPU
    per window). The same elements, the same arithmetic: the same floats as statistics.median."""
    values = list(values)
    # Units, not nodes, count toward min_nodes: three nodes of two GPUs are six GPUs to compare
    # one with (a job of three such nodes was not judged at all); a node's figure is one unit.
    if len(values) < max(min_nodes, 2) or len({v.node for v in values}) < 2:
        return {}
    ordered = sorted(v.value for v in values)
    by_value = sorted((v.value, v.node) for v in values) if shared_tol is not None else []
    deviations: dict[float, list[float]] = {}  # by the others' median (a few distinct ones): |v - m|, sorted
    out = {}
    for one in values:
        if not one.judged:
            continue
        m = leave_one_out(ordered, one.value)
        if m < min_median:
            continue
        spread = deviations.get(m)
        if spread is None:
            spread = deviations[m] = sorted(abs(v - m) for v in ordered)
        ref = Robust(median=m, mad=leave_one_out(spread, abs(one.value - m)), n=len(ordered) - 1)
        deviation = one.value / m - 1.0
        z = ref.z(one.value, noise_floor * m)
        low = deviation <= -drop and z <= -z_min
        if low and shared_tol is not None:
            low = not _shared(by_value, one, shared_tol * m)
        out[one] = (VsPeers(one.value, m, deviation, z, low), ref)
    return out


def _shared(by_value: list[tuple[float, str]], one: NodeValue, tolerance: float) -> bool:
    """A unit of another node lies within `tolerance` of `one`'s value (`by_value` sorted)."""
    lo = bisect_left(by_value, (one.value - tolerance,))
    hi = bisect_right(by_value, (one.value + tolerance, "\U0010ffff"))
    return any(node != one.node for _, node in by_value[lo:hi])


def leave_one_out(ordered: Sequence[float], value: float) -> float:
    """The median of sorted `ordered` without one element equal to `value` (which it holds)."""
    gone = bisect_left(ordered, value)  # which of equal elements goes changes nothing

    def kept(i: int) -> float:  # the i-th element of what remains
        return ordered[i] if i < gone else ordered[i + 1]

    n = len(ordered) - 1
    return kept(n // 2) if n % 2 else (kept(n // 2 - 1) + kept(n // 2)) / 2
