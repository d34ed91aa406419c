"""Retention: time series older than the horizon (by sample time) are deleted. On PostgreSQL the
sample tables are partitioned by day (server/store/partitions.py): whole day partitions past the
horizon are dropped, and only the default partition (back-filled stragglers) is deleted row by
row; a day partition goes once all of it is past the horizon, so up to a day more is kept."""

from __future__ import annotations

from sqlalchemy import Connection, Engine, bindparam, delete, select, text

from server.hints.remedy import covering_ack, remedy_for
from server.store import acks, episodes, partitions, schema

GpuSampleT = schema.GpuSample.__table__
NicSampleT = schema.NicSample.__table__
XidT = schema.XidEvent.__table__
LogT = schema.IngestLog.__table__
EpisodeT = schema.Episode.__table__
NodeT = schema.Node.__table__


def apply_retention(engine: Engine, *, now: float, retention_s: float) -> dict[str, int]:
    """Delete rows older than now - retention_s; returns rows deleted per table."""
    cutoff = now - retention_s
    with engine.begin() as conn:
        return {
            "gpu_samples": _delete_samples(conn, GpuSampleT, GpuSampleT.c.gpu_id, schema.Gpu.id, cutoff),
            "nic_samples": _delete_samples(conn, NicSampleT, NicSampleT.c.nic_id, schema.Nic.id, cutoff),
            "xid_events": conn.execute(delete(XidT).where(XidT.c.ts < cutoff)).rowcount,
            "ingest_log": conn.execute(delete(LogT).where(LogT.c.max_ts < cutoff)).rowcount,
            # Open episodes stay, however old: they are still true.
            "episodes": _delete_episodes(conn, cutoff),
        }


def _delete_episodes(conn: Connection, cutoff: float) -> int:
    # A hardware fault still waiting for its remedy stays until an ack covers it or its node
    # booted since: forgetting it would put its GPU back in service (server/hints/remedy.py).
    # (A GPU that came back from that reboot lost, missing or with rows pending remap has
    # episodes of its own by then.)
    old = episodes.resolved_before(conn, before=cutoff, causes=("xid", "ecc"))
    if not old:
        return conn.execute(delete(EpisodeT).where(EpisodeT.c.resolved_at < cutoff)).rowcount
    known = [acks.as_ack(r) for r in acks.list_acks(conn)]
    boots = {(c, n): (a or {}).get("boot_time") if isinstance(a, dict) else None
             for c, n, a in conn.execute(select(NodeT.c.cluster, NodeT.c.name, NodeT.c.agent))}
    kept = [e["id"] for e in old if remedy_for(e) is not None and covering_ack(e, known) is None
            and not _booted_since(boots.get((e["cluster"], e["node"])), e["onset"])]
    stmt = delete(EpisodeT).where(EpisodeT.c.resolved_at < cutoff)
    if kept:
        stmt = stmt.where(EpisodeT.c.id.not_in(kept))
    return conn.execute(stmt).rowcount


def _booted_since(boot_time, onset: float) -> bool:
    return isinstance(boot_time, (int, float)) and not isinstance(boot_time, bool) and boot_time > onset


def _delete_samples(conn: Connection, table, series_column, inventory_id, cutoff: float) -> int:
    if not partitions.is_partitioned(conn, table.name):
        return _delete_per_series(conn, table, series_column, inventory_id, cutoff)
    dropped = partitions.drop_expired(conn, table.name, cutoff=cutoff)
    default = partitions.default_partition(table.name)
    return dropped + conn.execute(text(f'DELETE FROM "{default}" WHERE ts < :cutoff'), {"cutoff": cutoff}).rowcount


def _delete_per_series(conn: Connection, table, series_column, inventory_id, cutoff: float) -> int:
    # One range delete per series walks the (series id, ts) primary key; a single
    # "WHERE ts < cutoff" would scan the whole table, since ts has no index of its own.
    ids = conn.execute(select(inventory_id)).scalars().all()
    if not ids:
        return 0
    stmt = delete(table).where(series_column == bindparam("series"), table.c.ts < bindparam("cutoff"))
    deleted = 0
    for series in ids:
        deleted += conn.execute(stmt, {"series": series, "cutoff": cutoff}).rowcount
    return deleted
