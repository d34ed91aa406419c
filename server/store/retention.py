"""Retention: rows older than their horizon (by sample time) are deleted. Three horizons: raw
samples and the ingest log (short: their per-minute rollups stay), rollups and workload changes,
and the events (resolved episodes, their events, XIDs) kept longest. On PostgreSQL the
sample tables are partitioned by day (server/store/partitions.py): whole day partitions past the
horizon are dropped, and only the default partition (back-filled stragglers) is deleted row by
row; a day partition goes once all of it is past the horizon, so up to a day more is kept."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import NamedTuple

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
GpuRollupT = schema.GpuRollupT
NicRollupT = schema.NicRollupT
# Given a connection and the cutoff: ids of episodes resolved before it that must stay.
KeepEpisodes = Callable[[Connection, float], Collection[int]]


class Horizons(NamedTuple):
    """How long each kind of row is kept, in seconds."""

    raw_s: float
    rollup_s: float
    events_s: float

    @classmethod
    def same(cls, seconds: float) -> Horizons:
        return cls(seconds, seconds, seconds)


def apply_retention(engine: Engine, *, now: float, horizons: Horizons, keep_episodes: KeepEpisodes | None = None) -> dict[str, int]:
    """Delete rows past their horizon; returns rows deleted per table. Resolved episodes past
    it go too, but for those `keep_episodes` names (server/hints/held.py: a hardware fault
    still waiting for its remedy)."""
    raw, rolled, events = now - horizons.raw_s, now - horizons.rollup_s, now - horizons.events_s
    with engine.begin() as conn:
        return {
            "gpu_samples": _delete_samples(conn, GpuSampleT, GpuSampleT.c.gpu_id, schema.Gpu.id, raw),
            "nic_samples": _delete_samples(conn, NicSampleT, NicSampleT.c.nic_id, schema.Nic.id, raw),
            "ingest_log": conn.execute(delete(LogT).where(LogT.c.max_ts < raw)).rowcount,
            "gpu_rollups": _delete_per_series(conn, GpuRollupT, GpuRollupT.c.gpu_id, schema.Gpu.id, rolled // 60, "minute"),
            "nic_rollups": _delete_per_series(conn, NicRollupT, NicRollupT.c.nic_id, schema.Nic.id, rolled // 60, "minute"),
            "gpu_workloads": _delete_workloads(conn, rolled),
            "xid_events": conn.execute(delete(XidT).where(XidT.c.ts < events)).rowcount,
            # Open episodes stay, however old: they are still true.
            "episodes": _delete_episodes(conn, events, keep_episodes),
            # Taken by the alerts or not (alerts off): past the horizon an event tells no one anything.
            "episode_events": conn.execute(delete(EventT).where(EventT.c.at < events)).rowcount,
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


def _delete_per_series(conn: Connection, table, series_column, inventory_id, cutoff: float, time_column: str = "ts") -> int:
    # One range delete per series walks the (series id, ts) primary key; a single
    # "WHERE ts < cutoff" would scan the whole table, since ts has no index of its own.
    ids = conn.execute(select(inventory_id)).scalars().all()
    if not ids:
        return 0
    stmt = delete(table).where(series_column == bindparam("series"), table.c[time_column] < bindparam("cutoff"))
    deleted = 0
    for series in ids:
        deleted += conn.execute(stmt, {"series": series, "cutoff": cutoff}).rowcount
    return deleted
