"""Following the ingest log: which batches were committed since last time, and their rows.

Log ids are assigned at insert but committed in any order on PostgreSQL, so the cursor keeps
a low-water mark below which every id has been read, remembers the ids read above it, and
steps over a gap only once it is older than `gap_timeout_s` (a rolled-back transaction)."""

from __future__ import annotations

import bisect
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, and_, func, select

from server.detect.engine import NodeInstant
from server.detect.observe import GPU_READINGS, NIC_READINGS
from server.peer_groups import workload_job, workload_key, workload_label
from server.store import schema
from server.store.driver_rows import select_rows
from server.store.engine import read_snapshot

LogT = schema.IngestLog.__table__
GpuT, GpuSampleT = schema.Gpu.__table__, schema.GpuSample.__table__
NicT, NicSampleT = schema.Nic.__table__, schema.NicSample.__table__
XidT, NodeT = schema.XidEvent.__table__, schema.Node.__table__
WorkloadT = schema.GpuWorkload.__table__


XID_LOOKBACK_S = 300.0


@dataclass
class LogCursor:
    low_water: int = 0
    seen: set[int] = field(default_factory=set)
    gap_since: float | None = None
    gap_timeout_s: float = 30.0

    def take(self, conn: Connection, *, limit: int = 2000) -> list[dict[str, Any]]:
        rows = conn.execute(select(LogT).where(LogT.c.id > self.low_water).order_by(LogT.c.id).limit(limit)).mappings().all()
        return self.feed(rows)

    def feed(self, rows) -> list[dict[str, Any]]:
        """The entries of `rows` (log rows above low_water, in id order) not read before."""
        fresh = [dict(r) for r in rows if r["id"] not in self.seen]
        self.seen.update(r["id"] for r in fresh)
        self._advance(now=time.monotonic(), visible=[r["id"] for r in rows])
        return fresh

    def _advance(self, *, now: float, visible: list[int]) -> None:
        while self.low_water + 1 in self.seen:
            self.low_water += 1
            self.seen.discard(self.low_water)
        if self.seen and visible:
            # A hole below ids we have read: wait for it to commit, but not forever.
            self.gap_since = self.gap_since or now
            if now - self.gap_since > self.gap_timeout_s:
                self.low_water = min(self.seen) - 1
                self.gap_since = None
                self._advance(now=now, visible=[])
        else:
            self.gap_since = None


def read_committed(engine: Engine, cursors: dict[str, LogCursor],
                   keep: Callable[[str, list[dict[str, Any]]], list[dict[str, Any]]]) -> dict[str, list[NodeInstant]]:
    """The node instants committed since each cluster's cursor (`keep`: the entries of a
    cluster whose rows are wanted), all read in one snapshot: a batch that commits meanwhile
    is read whole with its log entry, or not at all."""
    with read_snapshot(engine) as conn:
        entries = take_clusters(conn, cursors)
        return {cluster: load_instants(conn, keep(cluster, found)) for cluster, found in entries.items() if found}


def take_clusters(conn: Connection, cursors: dict[str, LogCursor], *, limit: int = 2000) -> dict[str, list[dict[str, Any]]]:
    """New entries of each cluster, each cluster read by its own cursor (a cluster taken over
    from another replica resumes at that replica's position).

    Every cursor steps over the entries of every cluster, so its gap handling is the same as a
    single cursor's; cursors at the same position (in steady state, all of them) share a read."""
    out: dict[str, list[dict[str, Any]]] = {}
    at: dict[int, list[str]] = defaultdict(list)
    for cluster, cursor in cursors.items():
        at[cursor.low_water].append(cluster)
    for low, clusters in at.items():
        rows = conn.execute(select(LogT, NodeT.c.cluster, NodeT.c.name.label("node")).join(NodeT, NodeT.c.id == LogT.c.node_id)
                            .where(LogT.c.id > low).order_by(LogT.c.id).limit(limit)).mappings().all()
        for cluster in clusters:
            out[cluster] = [e for e in cursors[cluster].feed(rows) if e["cluster"] == cluster]
    return out


def load_instants(conn: Connection, entries: list[dict[str, Any]]) -> list[NodeInstant]:
    """The stored rows behind log entries, as one NodeInstant per node and sample time, in
    sample-time order across the nodes: what a cycle reads together arrived together, and a
    node read first must not make the others look late (Detector.add measures lateness against
    the newest sample it has seen).

    Read in bulk: one query per table for a chunk of nodes (not four per node), rows as plain
    tuples, each kept only if inside its own node's range."""
    ranges: dict[int, tuple[float, float]] = {}
    for e in entries:
        lo, hi = ranges.get(e["node_id"], (e["min_ts"], e["max_ts"]))
        ranges[e["node_id"]] = (min(lo, e["min_ts"]), max(hi, e["max_ts"]))
    # Nodes sorted by where their range starts, so a chunk's common range stays close to each
    # node's own (a node replaying its spool does not make the others read ten minutes).
    ordered = sorted(ranges, key=lambda node_id: ranges[node_id])
    instants: list[NodeInstant] = []
    for i in range(0, len(ordered), CHUNK_NODES):
        instants.extend(_chunk_instants(conn, {node_id: ranges[node_id] for node_id in ordered[i:i + CHUNK_NODES]}))
    instants.sort(key=lambda item: (item.ts, item.node))
    return instants


CHUNK_NODES = 500  # node ids per query (SQLite's bound-parameter limit, plan size)
_GPU_KEYS = ("ts", *GPU_READINGS, "uuid", "index", "model")
_NIC_KEYS = ("ts", *NIC_READINGS, "device", "port")


def _chunk_instants(conn: Connection, ranges: dict[int, tuple[float, float]]) -> list[NodeInstant]:
    ids = list(ranges)
    lo, hi = min(r[0] for r in ranges.values()), max(r[1] for r in ranges.values())
    nodes = {row.id: row for row in conn.execute(select(NodeT.c.id, NodeT.c.cluster, NodeT.c.name, NodeT.c.labels)
                                                 .where(NodeT.c.id.in_(ids)))}
    by_key: dict[tuple[int, float], NodeInstant] = {}

    def instant(node_id: int, ts: float) -> NodeInstant | None:
        first, last = ranges[node_id]
        if not first <= ts <= last:
            return None  # inside the chunk's range, outside this node's
        node = nodes[node_id]
        item = by_key[(node_id, ts)] = NodeInstant(node.cluster, node.name, dict(node.labels or {}), ts, [], [])
        return item

    workloads = _workloads(conn, ids, lo, hi)
    gpu_cols = [GpuSampleT.c.ts, *(GpuSampleT.c[m] for m in GPU_READINGS), GpuT.c.uuid, GpuT.c.index, GpuT.c.model, GpuT.c.node_id]
    # The driver's own tuples, made into the engine's rows in one C call each (dict(zip)): this
    # runs for every GPU and port of every instant, and building SQLAlchemy rows, or a row a
    # field at a time, cost about as much as the queries.
    gpu_rows = select_rows(conn, select(*gpu_cols).join(
        GpuSampleT, and_(GpuSampleT.c.gpu_id == GpuT.c.id, GpuSampleT.c.ts >= lo, GpuSampleT.c.ts <= hi)).where(GpuT.c.node_id.in_(ids)))
    for row in gpu_rows:
        item = by_key.get((row[-1], row[0])) or instant(row[-1], row[0])
        if item is not None:
            values = dict(zip(_GPU_KEYS, row))
            if workloads:
                _attach_workload(values, workloads.get(values["uuid"]))
            item.gpu_rows.append(values)
    nic_cols = [NicSampleT.c.ts, *(NicSampleT.c[m] for m in NIC_READINGS), NicT.c.device, NicT.c.port, NicT.c.node_id]
    nic_rows = select_rows(conn, select(*nic_cols).join(
        NicSampleT, and_(NicSampleT.c.nic_id == NicT.c.id, NicSampleT.c.ts >= lo, NicSampleT.c.ts <= hi)).where(NicT.c.node_id.in_(ids)))
    for row in nic_rows:
        item = by_key.get((row[-1], row[0])) or instant(row[-1], row[0])
        if item is not None:
            item.nic_rows.append(dict(zip(_NIC_KEYS, row)))
    # An XID is stamped when it happened, up to one sampling interval before the sample that
    # carried it; the detector attaches each to the first sample of its GPU at or after it.
    xids: dict[int, dict[str, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
    for xid, ts, uuid, node_id in conn.execute(
        select(XidT.c.xid, XidT.c.ts, GpuT.c.uuid, GpuT.c.node_id).join(GpuT, GpuT.c.id == XidT.c.gpu_id)
        .where(GpuT.c.node_id.in_(ids), XidT.c.ts > lo - XID_LOOKBACK_S, XidT.c.ts <= hi)
    ):
        if ranges[node_id][0] - XID_LOOKBACK_S < ts <= ranges[node_id][1]:
            xids[node_id][uuid].append((xid, ts))
    for (node_id, _), item in by_key.items():
        item.gpu_rows.sort(key=lambda r: r["index"])
        item.nic_rows.sort(key=lambda r: (r["device"], r["port"]))
        item.xids = xids.get(node_id, {})
    return list(by_key.values())


def _attach_workload(values: dict[str, Any], changes: tuple[list[float], list] | None) -> None:
    """The workload in effect at the row's instant: its last change at or before it."""
    if changes:
        at = bisect.bisect_right(changes[0], values["ts"]) - 1
        if at >= 0:
            values["workload"], values["workload_label"], values["workload_job"] = changes[1][at]


def _workloads(conn: Connection, ids: list[int], lo: float, hi: float) -> dict[str, tuple[list[float], list[tuple]]]:
    """Per GPU (uuid) of these nodes, the workload changes in effect over [lo, hi] (the last at or
    before lo, and those after it): their times and (workload_key, workload_label, workload_job), in time order
    (issue #15)."""
    cols = (GpuT.c.uuid, WorkloadT.c.ts, WorkloadT.c.kind, WorkloadT.c.namespace, WorkloadT.c.job, WorkloadT.c.pod, WorkloadT.c.slurm_job_id)
    last = (select(WorkloadT.c.gpu_id, func.max(WorkloadT.c.ts).label("ts")).join(GpuT, GpuT.c.id == WorkloadT.c.gpu_id)
            .where(GpuT.c.node_id.in_(ids), WorkloadT.c.ts <= lo).group_by(WorkloadT.c.gpu_id).subquery())
    rows = [*conn.execute(select(*cols).join(GpuT, GpuT.c.id == WorkloadT.c.gpu_id)
                          .join(last, and_(last.c.gpu_id == WorkloadT.c.gpu_id, last.c.ts == WorkloadT.c.ts))),
            *conn.execute(select(*cols).join(GpuT, GpuT.c.id == WorkloadT.c.gpu_id)
                          .where(GpuT.c.node_id.in_(ids), WorkloadT.c.ts > lo, WorkloadT.c.ts <= hi))]
    out: dict[str, tuple[list[float], list[tuple]]] = {}
    for uuid, ts, kind, namespace, job, pod, slurm_job_id in sorted(rows, key=lambda r: r[1]):
        times, keys = out.setdefault(uuid, ([], []))
        times.append(ts)
        names = dict(namespace=namespace, job=job, pod=pod, slurm_job_id=slurm_job_id)
        keys.append((workload_key(kind, **names), workload_label(kind, **names),
                     workload_job(kind, job=job, pod=pod, slurm_job_id=slurm_job_id)))
    return out
