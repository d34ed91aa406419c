"""One aligned window of one cluster, nodes against nodes (server/detect/across.py): which
findings each node gets for NVLink throughput, port throughput and power limits."""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

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


def judge_window(nodes: Iterable[NodeMembers], start: float, end: float, cfg: DetectionSettings) -> list[NodeVerdict]:
    nvlink: dict[str, list[NodeValue]] = defaultdict(list)
    limits: dict[str, list[NodeValue]] = defaultdict(list)
    ports: dict[str, list[NodeValue]] = defaultdict(list)
    for members in nodes:
        for group, windows in _by_group(members.gpus, end).items():
            _add(nvlink[group], node_value(members.node, [aligned_mean_rate(w, "nvlink_bps", start, end) for w in windows]))
            _add(limits[group], node_value(members.node, [_limit_at(w, start, end) for w in windows]))
        for group, windows in _by_group(members.ports, end).items():
            _add(ports[group], node_value(members.node, [aligned_mean_rate(w, "bps", start, end, steady="node_busy") for w in windows]))
    verdicts = []
    span = {"from": start, "to": end}
    for group, values in nvlink.items():
        judged = against_other_nodes(values, min_nodes=cfg.across_min_nodes, min_median=cfg.nvlink_min_bps, drop=cfg.nvlink_bw_drop,
                                     z_min=cfg.bw_z, noise_floor=cfg.bw_noise_floor)
        verdicts += [NodeVerdict(node, "nvlink", _finding("nvlink", node, vs, ref, group, span, "NVLink", "per GPU", gbps) if vs.low else None)
                     for node, (vs, ref) in judged.items()]
    for group, values in ports.items():
        judged = against_other_nodes(values, min_nodes=cfg.across_min_nodes, min_median=cfg.ib_min_bps, drop=cfg.ib_bw_drop,
                                     z_min=cfg.bw_z, noise_floor=cfg.bw_noise_floor)
        verdicts += [NodeVerdict(node, "network",
                                 _finding("network", node, vs, ref, group, span, "ports moving", "per port", gbps) if vs.low else None)
                     for node, (vs, ref) in judged.items()]
    for group, values in limits.items():
        judged = against_other_nodes(values, min_nodes=cfg.across_min_nodes, min_median=1.0, drop=cfg.power_limit_drop, z_min=0.0,
                                     noise_floor=0.01)
        verdicts += [NodeVerdict(node, "power", _finding("power", node, vs, ref, group, span, "power limit", "per GPU", _watts) if vs.low else None)
                     for node, (vs, ref) in judged.items()]
    return verdicts


def _add(values: list[NodeValue], value: NodeValue | None) -> None:
    if value is not None:
        values.append(value)


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


def _limit_at(window: Window, start: float, end: float) -> float | None:
    """The power limit through the window, when the GPU was busy at every sample in it."""
    items = window.items
    inside = items[bisect_right(items, start, key=ts_of):bisect_right(items, end, key=ts_of)]
    if not inside or not all(o.busy for o in inside):
        return None
    return inside[-1].power_limit_w


def _watts(value: float) -> str:
    return f"{value:.0f} W"


def _finding(cause: str, node: str, vs: VsPeers, ref: Robust, group: str, span: dict, what: str, unit: str, fmt) -> Finding:
    seconds = span["to"] - span["from"]
    summary = (f"node {node}: {what} {fmt(vs.value)} {unit} vs {fmt(vs.peer_median)}, the median of {ref.n} other nodes of its "
               f"group ({pct(vs.deviation)}), over the {seconds:.0f} s window aligned across them")
    evidence = {
        "metric": {"nvlink": "nvlink_bps", "network": "bps", "power": "power_limit_w"}[cause], "value": vs.value,
        "peer_median": vs.peer_median, "deviation": rnd(vs.deviation), "z": rnd(vs.z, 2), "window": span,
        "peers": {"scope": f"nodes of peer group {group}, window aligned across them", "count": ref.n, "median": ref.median,
                  "mad": ref.mad, "steady": "every member busy at each of its samples in the window, no counter reset"},
    }
    return Finding(cause=cause, severity="warning", summary=summary, evidence=evidence)
