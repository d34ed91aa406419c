"""Delivering the outbox: at least once, grouped, retried, surviving restarts.

Runs on a thread in the process that leads detection (is_leader), one cycle every poll_s:

1. route: each new episode event (server/store/episode_events.py) becomes its alert rows in the
   outbox (outbox.py), and each new outbox row gets one delivery row per receiver its labels
   route to;
2. deliver: a group (one receiver, one cluster, one cause) becomes due group_wait_s after its
   first pending alert was recorded; it is then leased (a row lease in the database, so that a
   second dispatcher, say during a leadership hand-over, cannot send it too) and every pending
   alert of the group goes out as ONE notification: an alert storm in one cluster for one cause
   is one page. For each fingerprint only the newest state is sent, except that an alert never
   sent firing is sent firing first and its resolve min_firing_s later. A 2xx marks them
   sent; anything else schedules a retry after an exponential backoff with jitter
   (backoff_initial_s doubling up to backoff_max_s, times 0.5-1.0), and after give_up_after_s the alerts are dropped, logged and counted;
3. Alertmanager receivers are re-sent their active alerts every alertmanager_resend_s;
4. delivered rows are deleted after keep_s.

State lives in the database only: a restart (or a new leader) continues with what is pending.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import httpx
from sqlalchemy import Engine, delete, exists, insert, or_, select, update

from server.alerts import targets
from server.alerts.outbox import alerts_from_events
from server.alerts.payload import alert_for_episode, group_key
from server.alerts.routing import Receiver, Routing
from server.alerts.settings import AlertSettings
from server.store import counters, episode_events, schema
from server.store.write_lock import WriteTurn

log = logging.getLogger(__name__)

OutboxT = schema.AlertOutbox.__table__
DeliveryT = schema.AlertDelivery.__table__
EpisodeT = schema.Episode.__table__
NOTIFICATIONS = "laggard_alert_notifications_total"
ALERTS_SENT = "laggard_alert_alerts_sent_total"
ROUTE_BATCH = 500


class AlertDispatcher:
    def __init__(self, engine: Engine, routing: Routing, cfg: AlertSettings, *, external_url: str,
                 is_leader: Callable[[], bool] = lambda: True, transport: httpx.BaseTransport | None = None,
                 clock: Callable[[], float] = time.time, jitter: Callable[[], float] = random.random):
        self.engine = engine
        self.routing = routing
        self.cfg = cfg
        self.external_url = external_url.rstrip("/")
        self.is_leader = is_leader
        self.clock = clock
        self.jitter = jitter
        self.transport = transport or httpx.HTTPTransport()
        self._turn = WriteTurn.for_engine(engine)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="alert-dispatcher", daemon=True)
        self._next_resend = 0.0
        self._next_prune = 0.0
        self.cycles = 0

    # --- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self.cfg.timeout_s + 30)
        self.transport.close()
        self._turn.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self.is_leader():
                    self.run_once()
            except Exception:
                log.exception("alert dispatch cycle failed; will retry")
            self._stop.wait(self.cfg.poll_s)

    # --- one cycle ---------------------------------------------------------------------------------

    def run_once(self) -> int:
        """Route, deliver what is due, re-send to Alertmanagers, prune. Returns notifications sent."""
        now = self.clock()
        self.route(now)
        sent = self.deliver(now)
        if self.routing.alertmanagers() and now >= self._next_resend:
            self.resend_active(now)
            self._next_resend = now + self.cfg.alertmanager_resend_s
        if now >= self._next_prune:
            self.prune(now)
            self._next_prune = now + 3600.0
        self.cycles += 1
        return sent

    def route(self, now: float) -> int:
        with self._turn.held(), self.engine.begin() as conn:
            alerts_from_events(conn, limit=ROUTE_BATCH)
            rows = conn.execute(
                select(OutboxT.c.id, OutboxT.c.created_at, OutboxT.c.cluster, OutboxT.c.cause, OutboxT.c.alert)
                .where(OutboxT.c.routed.is_(False)).order_by(OutboxT.c.id).limit(ROUTE_BATCH)
            ).all()
            if not rows:
                return 0
            deliveries = []
            for outbox_id, created_at, cluster, cause, alert in rows:
                for receiver in self.routing.receivers_for(alert["labels"]):
                    deliveries.append({
                        "outbox_id": outbox_id, "receiver": receiver.name, "group_key": group_key(cluster, cause), "state": "pending",
                        "attempts": 0, "created_at": created_at, "next_attempt_at": created_at + self.cfg.group_wait_s,
                    })
            if deliveries:
                conn.execute(insert(DeliveryT), deliveries)
            conn.execute(update(OutboxT).where(OutboxT.c.id.in_([r[0] for r in rows])).values(routed=True))
        return len(rows)

    def deliver(self, now: float) -> int:
        with self.engine.connect() as conn:
            due = conn.execute(
                select(DeliveryT.c.receiver, DeliveryT.c.group_key).distinct()
                .where(DeliveryT.c.state == "pending", DeliveryT.c.next_attempt_at <= now, _lease_free(now))
            ).all()
        sent = 0
        for receiver_name, key in due:
            if self._stop.is_set():
                break
            sent += self._deliver_group(receiver_name, key, now)
        return sent

    def _deliver_group(self, receiver_name: str, key: str, now: float) -> int:
        token = uuid.uuid4().hex
        lease_until = now + self.cfg.timeout_s * 2 + 30.0
        with self._turn.held(), self.engine.begin() as conn:
            # One statement: the lease condition is re-checked on each row as it is updated, so two
            # dispatchers never hold the same row.
            conn.execute(update(DeliveryT).where(
                DeliveryT.c.state == "pending", DeliveryT.c.receiver == receiver_name, DeliveryT.c.group_key == key, _lease_free(now),
            ).values(lease_token=token, lease_until=lease_until))
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(DeliveryT.c.id, DeliveryT.c.attempts, DeliveryT.c.created_at, OutboxT.c.alert, OutboxT.c.fingerprint)
                .join(OutboxT, OutboxT.c.id == DeliveryT.c.outbox_id)
                .where(DeliveryT.c.lease_token == token).order_by(OutboxT.c.id)
            ).all()
        if not rows:
            return 0
        receiver = self.routing.receivers.get(receiver_name)
        if receiver is None:
            self._finish(token, rows, now, error="receiver no longer configured", give_up=True)
            return 0
        rows = self._hold_resolves_of_unsent_firings(rows, now)
        latest: dict[str, dict[str, Any]] = {}
        for _, _, _, alert, fp in rows:
            latest[fp] = alert  # rows are in outbox order: the newest state of each alert wins
        alerts = list(latest.values())
        try:
            targets.send(self.transport, receiver, alerts, external_url=self.external_url, dashboard_url=self.cfg.dashboard_url,
                         now=now, firing_ends_at=now + 4 * self.cfg.alertmanager_resend_s, timeout_s=self.cfg.timeout_s)
        except targets.DeliveryError as exc:
            self._finish(token, rows, self.clock(), error=str(exc), receiver=receiver)
            return 0
        self._finish(token, rows, self.clock(), sent_alerts=len(alerts), receiver=receiver)
        return 1

    def _hold_resolves_of_unsent_firings(self, rows: list, now: float) -> list:
        """The rows to send now. An alert whose firing has not gone out and whose newest state is
        resolved goes out firing now; its resolve waits min_firing_s (released from this lease),
        because a receiver that never saw it firing would never notify it (issue #16)."""
        first_firing: dict[str, int] = {}
        for i, (_, _, _, alert, fp) in enumerate(rows):
            if alert["status"] == "firing":
                first_firing.setdefault(fp, i)
        newest = {fp: alert["status"] for _, _, _, alert, fp in rows}
        held_fps = {fp for fp, status in newest.items() if status == "resolved" and fp in first_firing}
        if not held_fps:
            return rows
        send = [r for i, r in enumerate(rows) if r[4] not in held_fps or i <= _last_firing(rows, r[4])]
        held = [r[0] for r in rows if r not in send]
        with self._turn.held(), self.engine.begin() as conn:
            conn.execute(update(DeliveryT).where(DeliveryT.c.id.in_(held)).values(
                lease_token=None, lease_until=None, next_attempt_at=now + self.cfg.min_firing_s))
        return send

    def _finish(self, token: str, rows: list, now: float, *, error: str | None = None, receiver: Receiver | None = None,
                sent_alerts: int = 0, give_up: bool = False) -> None:
        name = receiver.name if receiver is not None else None
        with self._turn.held(), self.engine.begin() as conn:
            mine = DeliveryT.c.lease_token == token
            if error is None:
                conn.execute(update(DeliveryT).where(mine).values(state="sent", done_at=now, lease_token=None, lease_until=None,
                                                                  last_error=None))
                counters.add(conn, [(NOTIFICATIONS, {"receiver": name, "result": "sent"}, 1),
                                    (ALERTS_SENT, {"receiver": name}, sent_alerts)])
                return
            attempts = max(r[1] for r in rows) + 1
            oldest = min(r[2] for r in rows)
            if give_up or now - oldest > self.cfg.give_up_after_s:
                conn.execute(update(DeliveryT).where(mine).values(state="dead", done_at=now, lease_token=None, lease_until=None,
                                                                  attempts=attempts, last_error=error[:500]))
                if name is not None:
                    counters.add(conn, [(NOTIFICATIONS, {"receiver": name, "result": "dropped"}, 1)])
                log.error("alert delivery to receiver %s given up after %d attempts (%s): %d alert(s) dropped",
                          name or "(removed)", attempts, error, len(rows))
                return
            delay = min(self.cfg.backoff_max_s, self.cfg.backoff_initial_s * 2 ** (attempts - 1)) * (0.5 + 0.5 * self.jitter())
            conn.execute(update(DeliveryT).where(mine).values(attempts=attempts, next_attempt_at=now + delay, lease_token=None,
                                                              lease_until=None, last_error=error[:500]))
            counters.add(conn, [(NOTIFICATIONS, {"receiver": name, "result": "failed"}, 1)])
        log.warning("alert delivery to receiver %s failed (%s); attempt %d, next in %.1f s", name, error, attempts, delay)

    def resend_active(self, now: float) -> None:
        """Re-post every open episode to the Alertmanager receivers it routes to (firing, endsAt
        4 resend periods ahead). Failures wait for the next period."""
        with self.engine.connect() as conn:
            open_eps = [dict(r) for r in conn.execute(select(EpisodeT).where(EpisodeT.c.resolved_at.is_(None))).mappings()]
        by_receiver: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for ep in open_eps:
            alert = alert_for_episode(ep, status="firing")
            for receiver in self.routing.receivers_for(alert["labels"]):
                if receiver.type == "alertmanager":
                    by_receiver[receiver.name].append(alert)
        for name, alerts in by_receiver.items():
            try:
                targets.send(self.transport, self.routing.receivers[name], alerts, external_url=self.external_url,
                             dashboard_url=self.cfg.dashboard_url, now=now, firing_ends_at=now + 4 * self.cfg.alertmanager_resend_s,
                             timeout_s=self.cfg.timeout_s)
            except targets.DeliveryError as exc:
                log.warning("re-sending %d active alert(s) to Alertmanager receiver %s failed (%s)", len(alerts), name, exc)

    def prune(self, now: float) -> None:
        cutoff = now - self.cfg.keep_s
        with self._turn.held(), self.engine.begin() as conn:
            conn.execute(delete(DeliveryT).where(DeliveryT.c.state.in_(("sent", "dead")), DeliveryT.c.done_at < cutoff))
            has_delivery = exists().where(DeliveryT.c.outbox_id == OutboxT.c.id)
            conn.execute(delete(OutboxT).where(OutboxT.c.routed.is_(True), OutboxT.c.created_at < cutoff, ~has_delivery))
            episode_events.prune_alerted(conn, before=cutoff)

    def pending(self) -> int:
        with self.engine.connect() as conn:
            return len(conn.execute(select(DeliveryT.c.id).where(DeliveryT.c.state == "pending")).all())


def _last_firing(rows: list, fp: str) -> int:
    return max(i for i, r in enumerate(rows) if r[4] == fp and r[3]["status"] == "firing")


def _lease_free(now: float):
    return or_(DeliveryT.c.lease_until.is_(None), DeliveryT.c.lease_until < now)


def external_url_of(settings) -> str:
    if settings.alerts.external_url:
        return settings.alerts.external_url
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    return f"http://{host}:{settings.port}"

