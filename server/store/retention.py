"""Retention: time series older than the horizon (by sample time) are deleted. On PostgreSQL the
sample tables are partitioned by day (server/store/partitions.py): whole day partitions past the
horizon are dropped, and only the default partition (back-filled stragglers) is deleted row by
row; a day partition goes once all of it is past the horizon, so up to a day more is kept."""

from __future__ import annotations

from collections.abc import Callable, Collection

from sqlalchemy import Connection, Engine, bindparam, delete, func, select, text
from sqlalchemy.orm import aliased

from server.store import partitions, schema

GpuSampleT = schema.GpuSample.__table__
NicSampleT = schema.NicSample.__table__
XidT = schema.XidEvent.__table__
WorkloadT = schema.GpuWorkload.__table__
LogT = schema.IngestLog.__table__
EpisodeT = schema.Episode.__table__
EventT = schema.EpisodeEvent.__table__
# Given a connection and the cutoff: ids of episodes resolved before it that must stay.
KeepEpisodes = Callable[[Connection, float], Collection[int]]


def apply_retention(engine: Engine, *, now: float, retention_s: float, keep_episodes: KeepEpisodes | None = None) -> dict[str, int]:
    """Delete rows older than now - retention_s; returns rows deleted per table. Resolved
    episodes past it go too, but for those `keep_episodes` names (server/hints/held.py: a
    hardware fault still waiting for its remedy)."""
    cutoff = now - retention_s
    with engine.begin() as conn:
        return {
            "gpu_samples": _delete_samples(conn, GpuSampleT, GpuSampleT.c.gpu_id, schema.Gpu.id, cutoff),
            "nic_samples": _delete_samples(conn, NicSampleT, NicSampleT.c.nic_id, schema.Nic.id, cutoff),
            "xid_events": conn.execute(delete(XidT).where(XidT.c.ts < cutoff)).rowcount,
            "gpu_workloads": _delete_workloads(conn, cutoff),
            "ingest_log": conn.execute(delete(LogT).where(LogT.c.max_ts < cutoff)).rowcount,
            # Open episodes stay, however old: they are still true.
            "episodes": _delete_episodes(conn, cutoff, keep_episodes),
            # Taken by the alerts or not (alerts off): past the horizon an event tells no one anything.
            "episode_events": conn.execute(delete(EventT).where(EventT.c.at < cutoff)).rowcount,
        }


def _delete_workloads(conn: Connection, cutoff: float) -> int:
    # A change row is a GPU's workload until its next one: the row in effect at the cutoff
    # stays (the GPU may still run that job), only those it superseded go.
    later = aliased(WorkloadT)
    in_effect = select(func.max(later.c.ts)).where(later.c.gpu_id == WorkloadT.c.gpu_id, later.c.ts <= cutoff).scalar_subquery()
    return conn.execute(delete(WorkloadT).where(WorkloadT.c.ts < cutoff, WorkloadT.c.ts < in_effect)).rowcount


def _delete_episodes(conn: Connection, cutoff: float, keep_episodes: KeepEpisodes | None) -> int:
    kept = list(keep_episodes(conn, cutoff)) if keep_episodes is not None else []
    stmt = delete(EpisodeT).where(EpisodeT.c.resolved_at < cutoff)
    if kept:
        stmt = stmt.where(EpisodeT.c.id.not_in(kept))
    return conn.execute(stmt).rowcount


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
