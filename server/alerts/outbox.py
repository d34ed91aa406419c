"""The alert outbox: episode changes become alert rows in the detector's own transaction.

DetectionService._store calls record_episode_change() right after it has written an episode
change, on the same connection, so the episode and its alert commit together or not at all: a
crash can neither lose an alert whose episode was stored nor send one whose episode was not.
The dispatcher (dispatcher.py) delivers from this table; nothing here talks to the network.

The same transaction counts the change in the shared counters (laggard_episodes_*_total).
"""

from __future__ import annotations

import time
from typing import Any, Literal

from sqlalchemy import Connection, insert, select

from server.alerts.payload import alert_for_episode
from server.store import counters, schema

EpisodeT = schema.Episode.__table__
OutboxT = schema.AlertOutbox.__table__

Change = Literal["opened", "escalated", "resolved"]


def record_episode_change(conn: Connection, *, episode_id: int, change: Change, now: float | None = None) -> None:
    """Queue the alert(s) for one stored episode change (call inside the transaction that stored it)."""
    ep = conn.execute(select(EpisodeT).where(EpisodeT.c.id == episode_id)).mappings().first()
    if ep is None:
        return
    ep = dict(ep)
    now = time.time() if now is None else now
    alerts: list[dict[str, Any]] = []
    if change == "opened":
        alerts.append(alert_for_episode(ep, status="firing"))
        deltas = [("laggard_episodes_opened_total", {"cluster": ep["cluster"], "cause": ep["cause"], "severity": ep["severity"]}, 1)]
    elif change == "escalated":
        previous = _last_firing_severity(conn, episode_id)
        if previous is not None and previous != ep["severity"]:
            # Severity is a label, so the escalated alert is a new alert: the old one resolves.
            alerts.append(alert_for_episode(ep, status="resolved", severity=previous, ends_at=now))
        alerts.append(alert_for_episode(ep, status="firing"))
        deltas = [("laggard_episodes_escalated_total", {"cluster": ep["cluster"], "cause": ep["cause"]}, 1)]
    elif change == "resolved":
        ends_at = ep["resolved_at"] if ep["resolved_at"] is not None else now
        alerts.append(alert_for_episode(ep, status="resolved", ends_at=min(ends_at, now)))
        deltas = [("laggard_episodes_resolved_total", {"cluster": ep["cluster"], "cause": ep["cause"]}, 1)]
    else:
        raise ValueError(f"unknown episode change {change!r}")
    conn.execute(insert(OutboxT), [
        {"episode_id": episode_id, "created_at": now, "status": a["status"], "cluster": ep["cluster"], "cause": ep["cause"],
         "fingerprint": a["fingerprint"], "alert": a, "routed": False}
        for a in alerts
    ])
    counters.add(conn, deltas)


def _last_firing_severity(conn: Connection, episode_id: int) -> str | None:
    alert = conn.execute(
        select(OutboxT.c.alert).where(OutboxT.c.episode_id == episode_id, OutboxT.c.status == "firing").order_by(OutboxT.c.id.desc()).limit(1)
    ).scalar()
    return None if alert is None else alert["labels"]["severity"]
