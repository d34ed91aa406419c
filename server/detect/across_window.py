"""One aligned window of one cluster, nodes against nodes (server/detect/across.py): which
findings each node (or GPU of a node too small for peers inside it) gets for NVLink throughput
and port throughput (over throughput windows), power limits and free clocks (over gauge
windows)."""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from server.detect.across import NodeValue, against_other_nodes, aligned_mean_rate, node_value
from server.detect.model import Finding, Robust, Window, ts_of
from server.detect.rules._common import VsPeers, gbps, pct, rnd
from server.detect.settings import DetectionSettings


@dataclass(frozen=True, slots=True)
class NodeMembers:
    """A node's GPU and port windows, as the engine holds them."""

    node: str
    gpus: list[Window]
    ports: list[Window]


@dataclass(frozen=True, slots=True)
class NodeVerdict:
    node: str
    cause: str
    finding: Finding | None  # None: judged and fine
    gpu: tuple[str, int] | None = None  # (uuid, index): a GPU judged on its own (a node with too few of its group)


@dataclass(frozen=True, slots=True)
class GroupMeasures:
    """What one node's GPUs of one group measured over one window (None: not measurable): the
    NVLink throughput over a throughput window, the rest over a gauge window."""

    gpus: tuple[tuple[str, int], ...]  # (uuid, index), in the order of the values
    nvlink: tuple[float | None, ...] = ()
    limits: tuple[float | None, ...] = ()
    free_clocks: tuple[float | None, ...] = ()
    best_clocks: tuple[float | None, ...] = ()  # the highest clock, held down or not


@dataclass(frozen=True, slots=True)
class NodeMeasures:
    """A node's share of one window, taken as soon as the node is judged past its end: it reads
    nothing but the node's own samples, so it is the same whenever the other nodes arrive, and
    the window can wait for late nodes without keeping everyone's samples."""

    node: str
    gpus: dict[str, GroupMeasures]
    ports: dict[str, tuple[float | None, ...]]


def measure_throughput(members: NodeMembers, start: float, end: float, cfg: DetectionSettings) -> NodeMeasures:
    gpus = {group: GroupMeasures(_ids(windows), nvlink=tuple(aligned_mean_rate(w, "nvlink_bps", start, end) for w in windows))
            for group, windows in _by_group(members.gpus, end).items()}
    ports = {group: tuple(aligned_mean_rate(w, "bps", start, end, steady="node_busy") for w in windows)
             for group, windows in _by_group(members.ports, end).items()}
    return NodeMeasures(members.node, gpus, ports)


def measure_gauges(members: NodeMembers, start: float, end: float, cfg: DetectionSettings) -> NodeMeasures:
    """A node with min_peers GPUs of a group or more takes part for that group in one gauge window
    a minute (those ending at a multiple of across_window_s): its GPUs are judged inside the
    node at once, and what it brings here (a whole node's lower limit; a reference for small
    nodes' GPUs) can wait a minute, as it always had; in every window, it was half the
    detector's CPU again on a fleet of 8-GPU nodes."""
    gpus = {}
    minute = (end / cfg.across_window_s).is_integer()
    for group, windows in _by_group(members.gpus, end).items():
        if len(windows) >= cfg.min_peers and not minute:
            continue
        busy = [_busy_inside(w, start, end) for w in windows]  # read three times below: sliced once
        if all(inside == [] for inside in busy):
            continue  # no sample in the window (sampled less often): its last measure stands for it (Kind.carries)
        gpus[group] = GroupMeasures(_ids(windows), limits=tuple(inside[-1].power_limit_w if inside else None for inside in busy),
                                    free_clocks=tuple(_best_free_clock(inside) for inside in busy),
                                    best_clocks=tuple(_best_clock(inside) for inside in busy))
    return NodeMeasures(members.node, gpus, {})


def judge_throughput(measures: Iterable[NodeMeasures], start: float, end: float, cfg: DetectionSettings,
                     carried: Iterable[NodeMeasures] = ()) -> list[NodeVerdict]:
    """`carried`: none (the kind does not carry: a node's throughput of another minute is not
    this one's)."""
    nvlink: dict[str, list[NodeValue]] = defaultdict(list)
    ports: dict[str, list[NodeValue]] = defaultdict(list)
    for m in measures:
        for group, g in m.gpus.items():
            nvlink[group] += _units(m.node, g.gpus, g.nvlink, cfg.min_peers)
        for group, values in m.ports.items():
            # Ports are a node's, whatever their number: their figure is the node's.
            ports[group] += _units(m.node, (), values, 0)
    verdicts = []
    span = {"from": start, "to": end}
    for group, values in nvlink.items():
        judged = against_other_nodes(values, min_nodes=cfg.across_min_nodes, min_median=cfg.nvlink_min_bps, drop=cfg.nvlink_bw_drop,
                                     z_min=cfg.bw_z, noise_floor=cfg.bw_noise_floor, shared_tol=cfg.shared_tol)
        verdicts += _verdicts("nvlink", judged, lambda unit, vs, ref: _finding("nvlink", unit, vs, ref, group, span, "NVLink", "per GPU", gbps))
    for group, values in ports.items():
        judged = against_other_nodes(values, min_nodes=cfg.across_min_nodes, min_median=cfg.ib_min_bps, drop=cfg.ib_bw_drop,
                                     z_min=cfg.bw_z, noise_floor=cfg.bw_noise_floor, shared_tol=cfg.shared_tol)
        verdicts += _verdicts("network", judged, lambda unit, vs, ref: _finding("network", unit, vs, ref, group, span, "ports moving", "per port",
                                                                      gbps))
    return verdicts


def judge_gauges(measures: Iterable[NodeMeasures], start: float, end: float, cfg: DetectionSettings,
                 carried: Iterable[NodeMeasures] = ()) -> list[NodeVerdict]:
    """`measures`: the nodes with samples in the window, judged; `carried`: the others' latest
    measures from the minute before (Kind.carries), their reference only."""
    limits: dict[str, list[NodeValue]] = defaultdict(list)
    gpu_groups: dict[str, list[tuple[str, GroupMeasures, bool]]] = defaultdict(list)
    for m, fresh in [*((m, True) for m in measures), *((m, False) for m in carried)]:
        for group, g in m.gpus.items():
            gpu_groups[group].append((m.node, g, fresh))
            limits[group] += _units(m.node, g.gpus, g.limits, cfg.min_peers, judged=fresh)
    verdicts = []
    span = {"from": start, "to": end}
    for group, values in limits.items():
        judged = against_other_nodes(values, min_nodes=cfg.across_min_nodes, min_median=1.0, drop=cfg.power_limit_drop, z_min=0.0,
                                     noise_floor=0.01)
        verdicts += _verdicts("power", judged, lambda unit, vs, ref: _finding("power", unit, vs, ref, group, span, "power limit", "per GPU", _watts))
    for group, members in gpu_groups.items():
        if all(len(g.gpus) >= cfg.min_peers for _, g, _ in members):
            continue  # every GPU has peers inside its node: the clock rule judges it there, at once
        judged = against_other_nodes(_free_clock_units(members, cfg.min_peers), min_nodes=cfg.across_min_nodes,
                                     min_median=0.0, drop=cfg.clock_drop, z_min=cfg.clock_z, noise_floor=cfg.clock_noise_floor)
        verdicts += _verdicts("clock", judged, lambda unit, vs, ref: _finding("clock", unit, vs, ref, group, span, "SM clock with nothing "
                                                                      "holding it down at best", "of max", _percent))
    return verdicts


@dataclass(frozen=True, slots=True)
class Kind:
    """Windows of one width, aligned across a cluster's nodes: what each node measures of its
    own samples over one, and how a window's measures are judged."""

    name: str
    width: Callable[[DetectionSettings], float]
    measure: Callable[[NodeMembers, float, float, DetectionSettings], NodeMeasures]
    judge: Callable[..., list[NodeVerdict]]  # (measures, start, end, cfg, carried)
    big_nodes_each_minute: bool = False  # measure_gauges
    # A node without samples in a window (sampled less often than the windows come, its sample
    # jittered past one, a node with peers inside it between two minutes) is still the others'
    # reference by its latest measure up to across_window_s old: at 15 s sampling a gauge window
    # of 5 s held a third of the nodes, too few to compare (recall 0.84 on 1-GPU nodes).
    carries: bool = False


# Throughput over long windows (counters interpolated at both ends: a node's phase moves a small
# part of one interval's traffic); gauges over short ones (a power limit and a free clock need
# no interpolation, and a minute's window was one to two minutes to find a slow small node).
KINDS = (Kind("throughput", lambda cfg: cfg.across_window_s, measure_throughput, judge_throughput),
         Kind("gauges", lambda cfg: cfg.across_gauge_window_s, measure_gauges, judge_gauges, big_nodes_each_minute=True, carries=True))


def _ids(windows: list[Window]) -> tuple[tuple[str, int], ...]:
    return tuple((w.latest.uuid, w.latest.index) for w in windows)


def _free_clock_units(members: list[tuple[str, GroupMeasures, bool]], min_peers: int) -> list[NodeValue]:
    """GPUs of nodes with fewer than min_peers of the group are judged by their best free clock
    in the window (server/detect/model.py `free_clock`); every other GPU is their reference by
    its best clock, held down or not. A clock a power cap holds down is less than the GPU could
    run at, so a free clock below it is a slow GPU all the same: on a job whose GPUs spend every
    sample on their cap (the free clocks of the rest all unknown), a GPU 12% slow with nothing
    holding it was compared with nothing and missed."""
    units = []
    for node, g, fresh in members:
        small = len(g.gpus) < min_peers
        for gpu, free, best in zip(g.gpus, g.free_clocks, g.best_clocks):
            if small and fresh and free is not None:
                units.append(NodeValue(node, free, 1, gpu=gpu))
            elif best is not None:
                units.append(NodeValue(node, best, 1, gpu=gpu, judged=False))
    return units


def _best_free_clock(inside: list | None) -> float | None:
    """The highest free clock of a window's busy samples (`_busy_inside`: a pause's edges ramp
    the clock with no reason bit), when one of them was free."""
    if not inside:
        return None
    return max((o.free_clock for o in inside if o.free_clock is not None), default=None)


def _best_clock(inside: list | None) -> float | None:
    return max((o.sm_clock_ratio for o in inside if o.sm_clock_ratio is not None), default=None) if inside else None


def _percent(ratio: float) -> str:
    return f"{ratio * 100:.0f}%"


def _units(node: str, gpus: tuple[tuple[str, int], ...], values: tuple[float | None, ...], min_peers: int, *,
           judged: bool = True) -> list[NodeValue]:
    """What a node brings to the comparison: its figure (the median of its members), or, with
    fewer than min_peers members, each member on its own; nothing unless all were measured
    (`judged` False: the others' reference only)."""
    if len(values) >= min_peers:
        one = node_value(node, values)
        return [one if judged else replace(one, judged=False)] if one is not None else []
    if not values or any(v is None for v in values):
        return []
    return [NodeValue(node, v, 1, gpu=gpu, judged=judged) for gpu, v in zip(gpus, values)]


Explain = Callable[[NodeValue, VsPeers, Robust], Finding]


def _verdicts(cause: str, judged: dict[NodeValue, tuple[VsPeers, Robust]], explain: Explain) -> list[NodeVerdict]:
    """Each node's verdict from its figure. A node judged GPU by GPU: every GPU low (two or
    more) is the node's finding, as a figure would have found it (a lower limit on the whole
    node, a switch tray); otherwise each GPU gets its own, and the node's is fine."""
    out = []
    by_node: dict[str, list[tuple[NodeValue, VsPeers, Robust]]] = defaultdict(list)
    for unit, (vs, ref) in judged.items():
        if unit.gpu is None:
            out.append(NodeVerdict(unit.node, cause, explain(unit, vs, ref) if vs.low else None))
        else:
            by_node[unit.node].append((unit, vs, ref))
    for node, units in by_node.items():
        whole = len(units) >= 2 and all(vs.low for _, vs, _ in units)
        # The least low of them: what every GPU of the node is below.
        unit, vs, ref = max(units, key=lambda u: u[0].value)
        out.append(NodeVerdict(node, cause, explain(NodeValue(node, unit.value, len(units)), vs, ref) if whole else None))
        out += [NodeVerdict(node, cause, explain(u, v, r) if v.low and not whole else None, gpu=u.gpu) for u, v, r in units]
    return out


def _by_group(windows: list[Window], end: float) -> dict[str, list[Window]]:
    groups: dict[str, list[Window]] = defaultdict(list)
    for w in windows:
        items = w.items
        if not items or items[-1].ts < end:
            continue  # not reporting through the window (a GPU lost, a port gone): not a member
        last = next((o for o in reversed(items) if o.ts <= end), None)
        if last is not None:
            groups[last.group].append(w)
    return groups


def _busy_inside(window: Window, start: float, end: float) -> list | None:
    """The GPU's samples in (start, end] when it was busy at every one of them (what its power
    limit through the window and its free clock are read from); None when it was not, [] when
    it has no sample there."""
    items = window.items
    inside = items[bisect_right(items, start, key=ts_of):bisect_right(items, end, key=ts_of)]
    if not all(o.busy for o in inside):
        return None
    return inside


def _watts(value: float) -> str:
    return f"{value:.0f} W"


def _finding(cause: str, unit: NodeValue, vs: VsPeers, ref: Robust, group: str, span: dict, what: str, per: str, fmt) -> Finding:
    seconds = span["to"] - span["from"]
    if unit.gpu is None:
        who, others = f"node {unit.node}", f"{ref.n} other nodes of its group"
    else:
        who = f"GPU {unit.gpu[1]} of node {unit.node} (too few GPUs of its group there to compare inside the node)"
        others = f"{ref.n} others of its group (nodes, and GPUs of nodes as small as its own)"
    summary = f"{who}: {what} {fmt(vs.value)} {per} vs {fmt(vs.peer_median)}, the median of {others} ({pct(vs.deviation)}), " \
              f"over the {seconds:.0f} s window aligned across them"
    evidence = {
        "metric": {"nvlink": "nvlink_bps", "network": "bps", "power": "power_limit_w", "clock": "free_clock"}[cause], "value": vs.value,
        "peer_median": vs.peer_median, "deviation": rnd(vs.deviation), "z": rnd(vs.z, 2), "window": span,
        "peers": {"scope": f"nodes of peer group {group}, window aligned across them", "count": ref.n, "median": ref.median,
                  "mad": ref.mad, "steady": "every member busy at each of its samples in the window, no counter reset"},
    }
    return Finding(cause=cause, severity="warning", summary=summary, evidence=evidence)
