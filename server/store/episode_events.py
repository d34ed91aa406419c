"""Episode events: what the detector tells the outputs, through storage, not imports.

The detector calls record() in the transaction that opened, escalated or resolved an episode,
so the change and its event commit together or not at all: a crash can neither lose the alert
of a stored change nor raise one for a change that was not stored. Each event carries the
episode as it stood at that moment; the alerts (server/alerts/outbox.py) turn events into
alert rows later, as they stood then. The same transaction counts the change
(laggard_episodes_*_total)."""

from __future__ import annotations

import time
from typing import Any, Literal

from sqlalchemy import Connection, insert, select, update

from server.store import counters, schema

EpisodeT = schema.Episode.__table__
EventT = schema.EpisodeEvent.__table__

Change = Literal["opened", "escalated", "resolved"]
CHANGES = ("opened", "escalated", "resolved")


def record(conn: Connection, *, episode_id: int, change: Change, now: float | None = None) -> None:
    """Record one stored episode change (call inside the transaction that stored it)."""
    if change not in CHANGES:
        raise ValueError(f"unknown episode change {change!r}")
    ep = conn.execute(select(EpisodeT).where(EpisodeT.c.id == episode_id)).mappings().first()
    if ep is None:
        return
    ep = dict(ep)
    conn.execute(insert(EventT), [{"episode_id": episode_id, "change": change, "at": time.time() if now is None else now,
                                   "episode": ep, "alerted": False}])
    labels = {"cluster": ep["cluster"], "cause": ep["cause"]}
    if change == "opened":
        labels["severity"] = ep["severity"]
    counters.add(conn, [(f"laggard_episodes_{change}_total", labels, 1)])


def take_unalerted(conn: Connection, *, limit: int) -> list[dict[str, Any]]:
    """The oldest events the alerts have not taken yet, marked taken (in the caller's
    transaction: what it derives from them commits with the mark)."""
    rows = [dict(r) for r in conn.execute(select(EventT).where(EventT.c.alerted.is_(False)).order_by(EventT.c.id).limit(limit)).mappings()]
    if rows:
        conn.execute(update(EventT).where(EventT.c.id.in_([r["id"] for r in rows])).values(alerted=True))
    return rows


def prune_alerted(conn: Connection, *, before: float) -> int:
    return conn.execute(EventT.delete().where(EventT.c.alerted.is_(True), EventT.c.at < before)).rowcount
