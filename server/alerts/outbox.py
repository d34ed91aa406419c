"""The alert outbox: episode events (server/store/episode_events.py) become alert rows.

The detector records each episode change as an event, in its own transaction; the dispatcher
(dispatcher.py) takes new events here, in the transaction that routes them, and builds each
alert from the episode as it stood when it changed. Taking an event and writing its alerts
commit together, so a crash between the two can neither lose an alert nor make one twice.
Nothing here talks to the network."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, insert, select

from server.alerts.payload import alert_for_episode
from server.store import episode_events, schema

OutboxT = schema.AlertOutbox.__table__


def alerts_from_events(conn: Connection, *, limit: int) -> int:
    """Alert rows for the episode events not taken yet, oldest first; returns events taken."""
    events = episode_events.take_unalerted(conn, limit=limit)
    for event in events:
        _alerts_for_event(conn, event)
    return len(events)


def _alerts_for_event(conn: Connection, event: dict[str, Any]) -> None:
    ep, change, now = event["episode"], event["change"], event["at"]
    alerts: list[dict[str, Any]] = []
    if change == "opened":
        alerts.append(alert_for_episode(ep, status="firing"))
    elif change == "escalated":
        previous = _last_firing_severity(conn, event["episode_id"])
        if previous is not None and previous != ep["severity"]:
            # Severity is a label, so the escalated alert is a new alert: the old one resolves.
            alerts.append(alert_for_episode(ep, status="resolved", severity=previous, ends_at=now))
        alerts.append(alert_for_episode(ep, status="firing"))
    elif change == "resolved":
        ends_at = ep["resolved_at"] if ep["resolved_at"] is not None else now
        alerts.append(alert_for_episode(ep, status="resolved", ends_at=min(ends_at, now)))
    if not alerts:
        return
    conn.execute(insert(OutboxT), [
        {"episode_id": event["episode_id"], "created_at": now, "status": a["status"], "cluster": ep["cluster"], "cause": ep["cause"],
         "fingerprint": a["fingerprint"], "alert": a, "routed": False}
        for a in alerts
    ])


def _last_firing_severity(conn: Connection, episode_id: int) -> str | None:
    alert = conn.execute(
        select(OutboxT.c.alert).where(OutboxT.c.episode_id == episode_id, OutboxT.c.status == "firing").order_by(OutboxT.c.id.desc()).limit(1)
    ).scalar()
    return None if alert is None else alert["labels"]["severity"]
