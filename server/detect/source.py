"""Following the ingest log: which batches were committed since last time, and their rows.

Log ids are assigned at insert but committed in any order on PostgreSQL, so the cursor keeps
a low-water mark below which every id has been read, remembers the ids read above it, and
steps over a gap only once it is older than `gap_timeout_s` (a rolled-back transaction)."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, and_, select

from server.detect.engine import NodeInstant
from server.protocol import GPU_METRICS, NIC_METRICS
from server.store import schema

LogT = schema.IngestLog.__table__
GpuT, GpuSampleT = schema.Gpu.__table__, schema.GpuSample.__table__
NicT, NicSampleT = schema.Nic.__table__, schema.NicSample.__table__
XidT, NodeT = schema.XidEvent.__table__, schema.Node.__table__


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
        rows = conn.execute(select(LogT, NodeT.c.cluster).join(NodeT, NodeT.c.id == LogT.c.node_id)
                            .where(LogT.c.id > low).order_by(LogT.c.id).limit(limit)).mappings().all()
        for cluster in clusters:
            out[cluster] = [e for e in cursors[cluster].feed(rows) if e["cluster"] == cluster]
    return out


def load_instants(conn: Connection, entries: list[dict[str, Any]]) -> list[NodeInstant]:
    """The stored rows behind log entries, as one NodeInstant per node and sample time, in
    sample-time order across the nodes: what a cycle reads together arrived together, and a
    node read first must not make the others look late (Detector.add measures lateness against
    the newest sample it has seen)."""
    ranges: dict[int, tuple[float, float]] = {}
    for e in entries:
        lo, hi = ranges.get(e["node_id"], (e["min_ts"], e["max_ts"]))
        ranges[e["node_id"]] = (min(lo, e["min_ts"]), max(hi, e["max_ts"]))
    instants: list[NodeInstant] = []
    for node_id, (lo, hi) in ranges.items():
        instants.extend(_node_instants(conn, node_id, lo, hi))
    instants.sort(key=lambda item: (item.ts, item.node))
    return instants


def _node_instants(conn: Connection, node_id: int, lo: float, hi: float) -> list[NodeInstant]:
    node = conn.execute(select(NodeT).where(NodeT.c.id == node_id)).mappings().one()
    base = {"cluster": node["cluster"], "node": node["name"]}
    by_ts: dict[float, NodeInstant] = {}

    def instant(ts: float) -> NodeInstant:
        if ts not in by_ts:
            by_ts[ts] = NodeInstant(node["cluster"], node["name"], dict(node["labels"] or {}), ts, [], [])
        return by_ts[ts]

    gpu_cols = [GpuSampleT.c.ts, *(GpuSampleT.c[m] for m in GPU_METRICS), GpuT.c.uuid, GpuT.c.index, GpuT.c.model]
    for row in conn.execute(
        select(*gpu_cols).join(GpuSampleT, and_(GpuSampleT.c.gpu_id == GpuT.c.id, GpuSampleT.c.ts >= lo, GpuSampleT.c.ts <= hi))
        .where(GpuT.c.node_id == node_id)
    ).mappings():
        instant(row["ts"]).gpu_rows.append(base | dict(row))
    nic_cols = [NicSampleT.c.ts, *(NicSampleT.c[m] for m in NIC_METRICS), NicT.c.device, NicT.c.port]
    for row in conn.execute(
        select(*nic_cols).join(NicSampleT, and_(NicSampleT.c.nic_id == NicT.c.id, NicSampleT.c.ts >= lo, NicSampleT.c.ts <= hi))
        .where(NicT.c.node_id == node_id)
    ).mappings():
        instant(row["ts"]).nic_rows.append(base | dict(row))
    # An XID is stamped when it happened, up to one sampling interval before the sample that
    # carried it; the detector attaches each to the first sample of its GPU at or after it.
    xids: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for row in conn.execute(
        select(XidT.c.xid, XidT.c.ts, GpuT.c.uuid).join(GpuT, GpuT.c.id == XidT.c.gpu_id)
        .where(GpuT.c.node_id == node_id, XidT.c.ts > lo - XID_LOOKBACK_S, XidT.c.ts <= hi)
    ).mappings():
        xids[row["uuid"]].append((row["xid"], row["ts"]))
    for item in by_ts.values():
        item.gpu_rows.sort(key=lambda r: r["index"])
        item.xids = xids
    return [by_ts[ts] for ts in sorted(by_ts)]
