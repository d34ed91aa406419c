"""Laggard's own per-GPU series: SM clock ratio, its deviation from the busy peers' median,
capacity, lost, NVLink links and CRC errors."""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from agent.exposition import Family
from server.metrics.families.hints import gpu_capacity
from server.metrics.families.labels import GPU_LABELS
from server.metrics.families.snapshot import Snapshot
from server.peer_groups import is_busy, peer_group

Members = list[tuple[tuple[str, ...], float]]  # (labels, SM clock ratio) of a peer group's busy GPUs


class LaggardGpuSeries:
    def __init__(self, min_peers: int):
        """`min_peers`: the detector's (DetectionSettings.min_peers), so a peer deviation is shown
        where the detector would compute one."""
        self.min_peers = min_peers

    def collect(self, snap: Snapshot) -> list[Family]:
        ratio, deviation, capacity, lost, links_up, links, crc = families = _empty_families()
        groups: dict[str, Members] = defaultdict(list)
        caps = gpu_capacity(snap)
        group_of = _PeerGroupMembers(snap.nodes, groups)
        peer_scope_of = snap.peer_scopes.get
        for g in snap.gpus:
            labels, m = g.labels, g.sample
            is_lost = bool(m["lost"])
            lost.add(labels, int(is_lost))
            capacity.add(labels, 0.0 if is_lost else caps.get((g.cluster, g.hostname, g.index), 1.0))
            if is_lost:
                continue
            sm, sm_max = m["sm_clock_mhz"], m["sm_clock_max_mhz"]
            if sm is not None and sm_max:
                r = sm / sm_max
                ratio.add(labels, r)
                if is_busy(m["util_gpu_pct"], m["clocks_event_reasons"]):
                    group_of[(g.node_id, g.model, peer_scope_of(g.gpu_id))].append((labels, r))
            for fam, column in ((links_up, "nvlink_links_up"), (links, "nvlink_links_total"), (crc, "nvlink_crc_errors_total")):
                if (v := m[column]) is not None:
                    fam.add(labels, v)
        _add_peer_deviation(deviation, groups, self.min_peers)
        return list(families)


def _empty_families() -> tuple[Family, ...]:
    """The families, empty, in exposition order: ratio, deviation, capacity, lost, NVLink links
    up, links, CRC errors."""
    return (
        Family("laggard_gpu_sm_clock_ratio", "gauge", "SM clock as a fraction of its maximum (latest sample).", GPU_LABELS),
        Family("laggard_gpu_peer_deviation_ratio", "gauge",
               "SM clock ratio relative to the median of its busy peers (same cluster, model and job), minus 1: "
               "-0.12 is 12% slower. Busy GPUs in groups of at least min_peers only.", GPU_LABELS),
        Family("laggard_gpu_capacity_ratio", "gauge",
               "Expected throughput of the GPU relative to a healthy peer, 0 to 1 (scheduler hints).", GPU_LABELS),
        Family("laggard_gpu_lost", "gauge", "1 when NVML reports the GPU lost or unreachable.", GPU_LABELS),
        Family("laggard_gpu_nvlink_links_up", "gauge", "NVLink links active.", GPU_LABELS),
        Family("laggard_gpu_nvlink_links", "gauge", "NVLink links the GPU has.", GPU_LABELS),
        Family("laggard_gpu_nvlink_crc_errors_total", "counter", "NVLink CRC errors (flit and data), all links.", GPU_LABELS),
    )


class _PeerGroupMembers(dict):
    """(node id, model, workload scope) -> the member list of its peer group in `groups`. The
    peer group is worked out on the first GPU of each node, model and workload only, not on
    every GPU."""

    def __init__(self, nodes: dict[int, Any], groups: dict[str, Members]):
        super().__init__()
        self.nodes, self.groups = nodes, groups

    def __missing__(self, key: tuple[int, str | None, str | None]) -> Members:
        node_id, model, workload = key
        node = self.nodes[node_id]
        # Peers as the detector's (server/detect/engine.py): same cluster, model and attributed
        # workload, the node's labels only where nothing is attributed; else a dashboard would
        # show a GPU's deviation from another job's GPUs, which the detector never compares it with.
        group = peer_group(cluster=node[1], model=model, labels=node[3] or {}, workload=workload)
        members = self[key] = self.groups[group]
        return members


def _add_peer_deviation(deviation: Family, groups: dict[str, Members], min_peers: int) -> None:
    """Each busy GPU's SM clock ratio against its peer group's median, minus 1; groups smaller
    than min_peers (and than 2) have no median worth comparing to."""
    for members in groups.values():
        if len(members) < max(min_peers, 2):
            continue
        median = statistics.median(r for _, r in members)
        if median > 0:
            deviation.keys += [labels for labels, _ in members]
            deviation.values += [r / median - 1.0 for _, r in members]
