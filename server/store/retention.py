"""Retention: time series older than the horizon (by sample time) are deleted."""

from __future__ import annotations

from sqlalchemy import Engine, delete

from server.store import schema

_TIMED_TABLES = (schema.GpuSample.__table__, schema.NicSample.__table__, schema.XidEvent.__table__)


def apply_retention(engine: Engine, *, now: float, retention_s: float) -> dict[str, int]:
    """Delete rows older than now - retention_s; returns rows deleted per table."""
    cutoff = now - retention_s
    deleted: dict[str, int] = {}
    with engine.begin() as conn:
        for table in _TIMED_TABLES:
            deleted[table.name] = conn.execute(delete(table).where(table.c.ts < cutoff)).rowcount
    return deleted
