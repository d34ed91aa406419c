"""Episodes in storage: opened, escalated, resolved by the detector; read by the API."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, insert, or_, select, update

from server.store import schema

EpisodeT = schema.Episode.__table__
PUBLIC_FIELDS = ("id", "cluster", "node", "gpu", "uuid", "cause", "severity", "onset", "detected_at", "resolved_at", "evidence", "summary")


def open_episode(conn: Connection, *, cluster: str, node: str, gpu: int | None, uuid: str | None, entity: str, cause: str,
                 severity: str, onset: float, detected_at: float, evidence: dict[str, Any], summary: str) -> int:
    result = conn.execute(
        insert(EpisodeT).values(cluster=cluster, node=node, gpu=gpu, uuid=uuid, entity=entity, cause=cause, severity=severity,
                                onset=onset, detected_at=detected_at, resolved_at=None, evidence=evidence, summary=summary[:1000])
    )
    return result.inserted_primary_key[0]


def escalate_episode(conn: Connection, *, episode_id: int, severity: str, evidence: dict[str, Any], summary: str) -> None:
    conn.execute(update(EpisodeT).where(EpisodeT.c.id == episode_id).values(severity=severity, evidence=evidence, summary=summary[:1000]))


def resolve_episode(conn: Connection, *, episode_id: int, resolved_at: float) -> None:
    conn.execute(update(EpisodeT).where(EpisodeT.c.id == episode_id).values(resolved_at=resolved_at))


def active_episodes(conn: Connection, *, cluster: str | None = None, node: str | None = None, cause: str | None = None,
                    severity: str | None = None, job: str | None = None) -> list[dict[str, Any]]:
    stmt = select(EpisodeT).where(EpisodeT.c.resolved_at.is_(None))
    for column, value in (("cluster", cluster), ("node", node), ("cause", cause), ("severity", severity)):
        if value is not None:
            stmt = stmt.where(EpisodeT.c[column] == value)
    return _of_job(_rows(conn, stmt.order_by(EpisodeT.c.detected_at, EpisodeT.c.id)), job)


def episodes_between(conn: Connection, *, since: float, until: float, cluster: str | None = None,
                     job: str | None = None) -> list[dict[str, Any]]:
    """Every episode that overlaps [since, until] in sample time."""
    stmt = select(EpisodeT).where(EpisodeT.c.onset <= until, or_(EpisodeT.c.resolved_at.is_(None), EpisodeT.c.resolved_at >= since))
    if cluster is not None:
        stmt = stmt.where(EpisodeT.c.cluster == cluster)
    return _of_job(_rows(conn, stmt.order_by(EpisodeT.c.onset, EpisodeT.c.id)), job)


def _of_job(rows: list[dict[str, Any]], job: str | None) -> list[dict[str, Any]]:
    """The episodes of one job (evidence.job: the attributed workload's job, issue #15)."""
    if job is None:
        return rows
    return [r for r in rows if isinstance(r["evidence"], dict) and r["evidence"].get("job") == job]


def resolved_before(conn: Connection, *, before: float, causes: tuple[str, ...], cluster: str | None = None) -> list[dict[str, Any]]:
    """Episodes of these causes resolved before `before` (sample time)."""
    stmt = select(EpisodeT).where(EpisodeT.c.resolved_at < before, EpisodeT.c.cause.in_(causes))
    if cluster is not None:
        stmt = stmt.where(EpisodeT.c.cluster == cluster)
    return _rows(conn, stmt.order_by(EpisodeT.c.onset, EpisodeT.c.id))


def active_for_detector(conn: Connection, *, cluster: str | None = None) -> list[dict[str, Any]]:
    stmt = select(EpisodeT.c.id, EpisodeT.c.entity, EpisodeT.c.cause, EpisodeT.c.severity).where(EpisodeT.c.resolved_at.is_(None))
    if cluster is not None:
        stmt = stmt.where(EpisodeT.c.cluster == cluster)
    return [dict(r) for r in conn.execute(stmt).mappings()]


def _rows(conn: Connection, stmt) -> list[dict[str, Any]]:
    return [{k: row[k] for k in PUBLIC_FIELDS} for row in conn.execute(stmt).mappings()]
