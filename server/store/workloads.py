"""What uses each GPU, stored as changes (issue #15 item 2): a gpu_workloads row only when a GPU's
workload differs from the one stored before it, in the same transaction as the samples.

An agent sends a workload with every sample of every GPU, and it changes once per job. Batches
keep only their own changes (unresolved_rows); the writer then drops, per GPU, a first row that
equals the GPU's latest stored one (one SELECT per group commit that carries workloads; none for
older agents, which send no workload). No row for a GPU means unknown, like a stored unknown row.
A row is compared with the workload in effect at its own ts, so re-sent and back-filled batches
(the agent's spool) store nothing twice.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, select
from sqlalchemy.orm import aliased

from server.protocol import WORKLOAD_FIELDS
from server.store import schema
from server.store.bulk_insert import BulkInsert

T = schema.GpuWorkload.__table__
IDLE = "idle"
assert tuple(c.name for c in T.columns)[2:] == WORKLOAD_FIELDS, "gpu_workloads columns != protocol Workload keys"

UNKNOWN: tuple = (None,) * len(WORKLOAD_FIELDS)
_VALUE_COLUMNS = [T.c[name] for name in WORKLOAD_FIELDS]


def values(workload: Mapping[str, Any] | None) -> tuple:
    """A wire workload (a dict, server/protocol.py Workload; None: unknown) as gpu_workloads
    columns after the key, idle (kind null) spelled out."""
    if workload is None:
        return UNKNOWN
    get = workload.get
    return (get("kind") or IDLE, *[get(name) for name in WORKLOAD_FIELDS[1:]])


def as_wire(row: tuple | Mapping[str, Any]) -> dict[str, Any] | None:
    """gpu_workloads columns (after the key) back as the wire object; None: unknown."""
    vals = tuple(row[c.name] for c in _VALUE_COLUMNS) if isinstance(row, Mapping) else tuple(row)
    if vals[0] is None:
        return None
    out = dict(zip(WORKLOAD_FIELDS, vals))
    if out["kind"] == IDLE:
        out["kind"] = None
    return out


class WorkloadWriter:
    def __init__(self, dialect_name: str):
        self.insert_rows = BulkInsert(dialect_name, T)

    def insert(self, conn: Connection, rows: list[tuple]) -> int:
        """rows: (gpu_id, ts, *values), a GPU's in sample order, each a change from the one
        before it in its batch. Stores those that differ from the workload in effect at their ts
        (the GPU's stored row at or before it, or a row kept here); how many. A re-sent or
        back-filled batch is compared with what held then, not with the latest."""
        if not rows:
            return 0
        known = in_effect_since(conn, {r[0] for r in rows}, min(r[1] for r in rows))
        keep = []
        for row in rows:
            gpu_id, ts, vals = row[0], row[1], row[2:]
            series = known.setdefault(gpu_id, [])
            at = bisect.bisect_right(series, ts, key=_ts)
            if (series[at - 1][1] if at else UNKNOWN) != vals:
                keep.append(row)
                series.insert(at, (ts, vals))
        self.insert_rows.execute(conn, keep)
        return len(keep)


def _ts(entry: tuple) -> float:
    return entry[0]


def in_effect_since(conn: Connection, gpu_ids: set[int], since: float) -> dict[int, list[tuple[float, tuple]]]:
    """Per GPU, its stored rows from the one in effect at `since` on, as (ts, values), oldest
    first: for pushes as they happen, just each GPU's latest row. GPUs without one are left out."""
    if not gpu_ids:
        return {}
    inner = aliased(T)
    start = (select(inner.c.ts).where(inner.c.gpu_id == T.c.gpu_id, inner.c.ts <= since)
             .order_by(inner.c.ts.desc()).limit(1).scalar_subquery())
    stmt = (select(T.c.gpu_id, T.c.ts, *_VALUE_COLUMNS)
            .where(T.c.gpu_id.in_(sorted(gpu_ids)), (T.c.ts >= start) | (T.c.ts > since))
            .order_by(T.c.gpu_id, T.c.ts))
    out: dict[int, list[tuple[float, tuple]]] = {}
    for row in conn.execute(stmt).all():
        out.setdefault(row[0], []).append((row[1], tuple(row[2:])))
    return out


def current(conn: Connection, gpu_ids: list[int]) -> dict[int, dict[str, Any]]:
    """{gpu id: the wire workload now, with `since`} for GPUs whose workload is known."""
    if not gpu_ids:
        return {}
    inner = aliased(T)
    newest = select(inner.c.ts).where(inner.c.gpu_id == T.c.gpu_id).order_by(inner.c.ts.desc()).limit(1).scalar_subquery()
    stmt = select(T).where(T.c.gpu_id.in_(sorted(gpu_ids)), T.c.ts == newest)
    out = {}
    for row in conn.execute(stmt).mappings():
        wire = as_wire(row)
        if wire is not None:
            out[row["gpu_id"]] = {"since": row["ts"], **wire}
    return out


def history(conn: Connection, *, gpu_id: int, since: float, until: float, limit: int) -> list[dict[str, Any]]:
    """The GPU's workloads over [since, until]: the one in effect at `since` (if any) and every
    change up to `until`, oldest first; each {since, until (the next change; None: still), workload}."""
    at_start = select(T.c.ts).where(T.c.gpu_id == gpu_id, T.c.ts <= since).order_by(T.c.ts.desc()).limit(1).scalar_subquery()
    stmt = (
        select(T).where(T.c.gpu_id == gpu_id, T.c.ts <= until, (T.c.ts >= at_start) | (T.c.ts > since))
        .order_by(T.c.ts).limit(limit + 1)
    )
    rows = list(conn.execute(stmt).mappings())
    ends = [r["ts"] for r in rows[1:]] + [None]
    return [{"since": r["ts"], "until": end, "workload": as_wire(r)} for r, end in zip(rows, ends)][:limit]
