"""The dispatcher on a real database (SQLite and PostgreSQL) with a fake clock and a fake HTTP
transport: outbox written with the episode, grouping, superseded states, exponential backoff
with jitter, giving up, row leases, pruning."""

from __future__ import annotations

import json

import httpx
import pytest
from sqlalchemy import func, select

from server.alerts.dispatcher import AlertDispatcher
from server.alerts.routing import load_routing
from server.alerts.settings import AlertSettings
from server.store import counters, episode_events, episodes, schema


class Clock:
    def __init__(self, t: float = 1_800_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


class Transport:
    """Records requests; answers with the next status of `statuses` (then 200)."""

    def __init__(self, *statuses: int):
        self.statuses = list(statuses)
        self.requests: list[tuple[str, dict]] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append((str(request.url), json.loads(request.content)))
        return httpx.Response(self.statuses.pop(0) if self.statuses else 200)


@pytest.fixture
def engine(migrated_engine):
    return migrated_engine


def make(engine, transport: Transport, clock: Clock, **cfg) -> AlertDispatcher:
    settings = AlertSettings(**({"group_wait_s": 10.0, "backoff_initial_s": 2.0, "backoff_max_s": 60.0} | cfg))
    routing = load_routing(webhook_urls="http://receiver.example/hook")
    return AlertDispatcher(engine, routing, settings, external_url="http://laggard:8080", clock=clock, jitter=lambda: 1.0,
                           transport=httpx.MockTransport(transport.handler))


def open_episode(engine, *, node="n1", gpu=0, cause="thermal", cluster="prod", severity="warning", at=1_800_000_000.0) -> int:
    with engine.begin() as conn:
        ep_id = episodes.open_episode(conn, cluster=cluster, node=node, gpu=gpu, uuid=f"GPU-{node}-{gpu}", entity=f"gpu:GPU-{node}-{gpu}",
                                      cause=cause, severity=severity, onset=at - 5, detected_at=at, evidence={"x": 1}, summary="slow")
        episode_events.record(conn, episode_id=ep_id, change="opened", now=at)
    return ep_id


def resolve(engine, ep_id: int, at: float) -> None:
    with engine.begin() as conn:
        episodes.resolve_episode(conn, episode_id=ep_id, resolved_at=at - 1)
        episode_events.record(conn, episode_id=ep_id, change="resolved", now=at)


def _count(engine, table) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(table.__table__)).scalar()


def test_episode_events_commit_with_the_episode_or_not_at_all(engine):
    with pytest.raises(RuntimeError):
        with engine.begin() as conn:
            ep_id = episodes.open_episode(conn, cluster="c", node="n", gpu=0, uuid="u", entity="gpu:u", cause="clock", severity="warning",
                                          onset=1.0, detected_at=2.0, evidence={}, summary="s")
            episode_events.record(conn, episode_id=ep_id, change="opened")
            raise RuntimeError("the detector's transaction fails")
    with engine.connect() as conn:
        assert counters.read_all(conn) == []
    assert _count(engine, schema.EpisodeEvent) == 0
    open_episode(engine)
    with engine.connect() as conn:
        assert counters.read_all(conn) == [("laggard_episodes_opened_total", {"cluster": "prod", "cause": "thermal", "severity": "warning"}, 1.0)]
    assert (_count(engine, schema.EpisodeEvent), _count(engine, schema.AlertOutbox)) == (1, 0)


def test_the_dispatcher_takes_each_event_once_into_the_outbox(engine):
    clock, transport = Clock(), Transport()
    d = make(engine, transport, clock)
    open_episode(engine, at=clock.t)
    assert d.route(clock.t) == 1
    assert d.route(clock.t) == 0
    assert (_count(engine, schema.EpisodeEvent), _count(engine, schema.AlertOutbox)) == (1, 1)


def test_alerts_show_the_episode_as_it_stood_when_it_changed(engine):
    """Events taken late (the dispatcher was down, or led elsewhere) still give the alerts of
    each change in turn: the warning fires, then resolves as the critical fires."""
    clock, transport = Clock(), Transport()
    d = make(engine, transport, clock)
    ep = open_episode(engine, at=clock.t)
    with engine.begin() as conn:
        episodes.escalate_episode(conn, episode_id=ep, severity="critical", evidence={"x": 2}, summary="slower")
        episode_events.record(conn, episode_id=ep, change="escalated", now=clock.t + 1)
    d.route(clock.t + 2)
    with engine.connect() as conn:
        rows = conn.execute(select(schema.AlertOutbox.__table__.c.alert).order_by(schema.AlertOutbox.__table__.c.id)).scalars().all()
    assert [(a["status"], a["labels"]["severity"], a["annotations"]["summary"]) for a in rows] == [
        ("firing", "warning", "slow"), ("resolved", "warning", "slower"), ("firing", "critical", "slower")]


def test_group_wait_groups_one_cluster_and_cause(engine):
    clock, transport = Clock(), Transport()
    d = make(engine, transport, clock)
    open_episode(engine, node="n1", at=clock.t)
    clock.t += 4
    open_episode(engine, node="n2", gpu=3, at=clock.t)
    open_episode(engine, node="n3", cause="nvlink", at=clock.t)  # another cause: another group
    open_episode(engine, node="n4", cluster="staging", at=clock.t)  # another cluster: another group
    d.run_once()
    assert transport.requests == []  # nothing is due before group_wait_s
    clock.t += 6.5  # the first thermal alert is due; the second (4 s younger) joins it
    assert d.run_once() == 1
    (url, doc), = transport.requests
    assert url == "http://receiver.example/hook"
    assert doc["groupLabels"] == {"cluster": "prod", "cause": "thermal"}
    assert sorted(a["labels"]["node"] for a in doc["alerts"]) == ["n1", "n2"]
    clock.t += 4
    assert d.run_once() == 2
    assert sorted((r[1]["groupLabels"]["cluster"], r[1]["groupLabels"]["cause"]) for r in transport.requests[1:]) == [
        ("prod", "nvlink"), ("staging", "thermal")]
    clock.t += 100
    assert d.run_once() == 0 and len(transport.requests) == 3  # each sent once


def test_an_episode_resolved_before_its_firing_went_out_is_sent_firing_then_resolved(engine):
    # Issue #16: opened and resolved within the startup pass, it was sent only as resolved, and a
    # receiver (Alertmanager) that never saw it firing never notified it.
    clock, transport = Clock(), Transport()
    d = make(engine, transport, clock, min_firing_s=60.0)
    ep = open_episode(engine, at=clock.t)
    clock.t += 2
    resolve(engine, ep, clock.t)
    clock.t += 20
    assert d.run_once() == 1
    (url, doc), = transport.requests
    assert [a["status"] for a in doc["alerts"]] == ["firing"] and doc["status"] == "firing"
    clock.t += 59
    assert d.run_once() == 0 and len(transport.requests) == 1  # the resolve waits min_firing_s
    clock.t += 2
    assert d.run_once() == 1
    resolved = transport.requests[1][1]
    assert [a["status"] for a in resolved["alerts"]] == ["resolved"]
    assert resolved["alerts"][0]["fingerprint"] == doc["alerts"][0]["fingerprint"]
    clock.t += 600
    assert d.run_once() == 0 and len(transport.requests) == 2  # each sent once


def test_a_resolve_of_a_firing_already_sent_is_not_held(engine):
    clock, transport = Clock(), Transport()
    d = make(engine, transport, clock, min_firing_s=60.0)
    ep = open_episode(engine, at=clock.t)
    clock.t += 11
    assert d.run_once() == 1
    resolve(engine, ep, clock.t)
    clock.t += 11
    assert d.run_once() == 1
    assert [r[1]["alerts"][0]["status"] for r in transport.requests] == ["firing", "resolved"]


def test_backoff_with_jitter_and_giving_up(engine, caplog):
    clock, transport = Clock(), Transport(500, 503, 500, 500, 500, 500, 500, 500, 500, 500)
    d = make(engine, transport, clock, give_up_after_s=100.0)
    open_episode(engine, at=clock.t)
    clock.t += 10
    attempts_at = []
    for _ in range(400):
        before = len(transport.requests)
        d.run_once()
        if len(transport.requests) > before:
            attempts_at.append(clock.t)
        clock.t += 0.5
    gaps = [b - a for a, b in zip(attempts_at, attempts_at[1:])]
    # jitter() = 1.0 → exactly the doubling delays (rounded up to the 0.5 s tick): 2, 4, 8, 16, 32, ...
    assert gaps[:5] == [2.0, 4.0, 8.0, 16.0, 32.0]
    with engine.connect() as conn:
        state, attempts, error = conn.execute(select(schema.AlertDelivery.state, schema.AlertDelivery.attempts,
                                                     schema.AlertDelivery.last_error)).one()
        got = {(name, tuple(sorted(labels.items()))): v for name, labels, v in counters.read_all(conn)}
    assert state == "dead" and error == "HTTP 500" and attempts == len(attempts_at)
    assert got[("laggard_alert_notifications_total", (("receiver", "webhook-1"), ("result", "dropped")))] == 1
    assert got[("laggard_alert_notifications_total", (("receiver", "webhook-1"), ("result", "failed")))] == len(attempts_at) - 1
    assert "given up" in caplog.text


def test_jitter_spreads_retries(engine):
    clock, transport = Clock(), Transport(500)
    d = make(engine, transport, clock)
    d.jitter = lambda: 0.0  # the low end of the range: half the delay
    open_episode(engine, at=clock.t)
    clock.t += 10
    d.run_once()
    with engine.connect() as conn:
        next_at = conn.execute(select(schema.AlertDelivery.next_attempt_at)).scalar()
    assert next_at == pytest.approx(clock.t + 1.0)


def test_a_leased_group_is_not_sent_twice(engine):
    clock = Clock()
    t1, t2 = Transport(), Transport()
    a, b = make(engine, t1, clock), make(engine, t2, clock)
    open_episode(engine, at=clock.t)
    clock.t += 20
    a.route(clock.t)
    # b leases the group first (as if it were sending right now): a finds nothing to send.
    from sqlalchemy import update

    from server.alerts.dispatcher import DeliveryT
    with engine.begin() as conn:
        conn.execute(update(DeliveryT).values(lease_token="b", lease_until=clock.t + 60))
    assert a.deliver(clock.t) == 0 and t1.requests == []
    clock.t += 61  # b died holding it: the lease expires and a sends
    assert a.deliver(clock.t) == 1 and len(t1.requests) == 1
    assert b.deliver(clock.t) == 0 and t2.requests == []


def test_escalation_resolves_the_warning_and_fires_the_critical(engine):
    clock, transport = Clock(), Transport()
    d = make(engine, transport, clock)
    ep = open_episode(engine, at=clock.t)
    clock.t += 20
    d.run_once()
    with engine.begin() as conn:
        episodes.escalate_episode(conn, episode_id=ep, severity="critical", evidence={"x": 2}, summary="slower")
        episode_events.record(conn, episode_id=ep, change="escalated", now=clock.t)
    clock.t += 20
    d.run_once()
    first, second = (doc for _, doc in transport.requests)
    assert [(a["status"], a["labels"]["severity"]) for a in first["alerts"]] == [("firing", "warning")]
    assert sorted((a["status"], a["labels"]["severity"]) for a in second["alerts"]) == [("firing", "critical"), ("resolved", "warning")]
    resolved_warning = next(a for a in second["alerts"] if a["status"] == "resolved")
    assert resolved_warning["fingerprint"] == first["alerts"][0]["fingerprint"]


def test_unrouted_alerts_and_pruning(engine):
    clock, transport = Clock(), Transport()
    d = make(engine, transport, clock, keep_s=100.0)
    d.routing = load_routing()  # no receivers at all
    open_episode(engine, at=clock.t)
    clock.t += 20
    d.run_once()
    assert transport.requests == []
    d.routing = load_routing(webhook_urls="http://receiver.example/hook")
    open_episode(engine, node="n2", at=clock.t)
    clock.t += 20
    d.run_once()
    assert len(transport.requests) == 1
    clock.t += 200
    d.prune(clock.t)
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(schema.AlertOutbox.__table__)).scalar() == 0
        assert conn.execute(select(func.count()).select_from(schema.AlertDelivery.__table__)).scalar() == 0
        assert conn.execute(select(func.count()).select_from(schema.EpisodeEvent.__table__)).scalar() == 0


def test_a_removed_receiver_drops_its_pending_alerts(engine):
    clock, transport = Clock(), Transport()
    d = make(engine, transport, clock)
    open_episode(engine, at=clock.t)
    d.route(clock.t)
    d.routing = load_routing(webhook_urls="")  # restarted without it
    clock.t += 20
    d.run_once()
    with engine.connect() as conn:
        assert conn.execute(select(schema.AlertDelivery.state, schema.AlertDelivery.last_error)).one() == (
            "dead", "receiver no longer configured")


def test_alertmanager_receivers_are_sent_active_alerts_again(engine):
    from server.alerts.payload import rfc3339
    from server.alerts.routing import Receiver, Routing

    clock, transport = Clock(), Transport()
    d = make(engine, transport, clock, alertmanager_resend_s=60.0)
    d.routing = Routing(receivers={"am": Receiver(name="am", url="http://am:9093/", type="alertmanager")}, default=("am",))
    ep = open_episode(engine, at=clock.t)
    d.run_once()  # the outbox alert is not due yet; the re-send of active alerts is
    (url, body), = transport.requests
    assert url == "http://am:9093/api/v2/alerts"
    assert [(a["labels"]["node"], a["endsAt"]) for a in body] == [("n1", rfc3339(clock.t + 240))]
    clock.t += 20
    d.run_once()  # the outbox delivery (same alert, posted as a list)
    assert len(transport.requests) == 2 and transport.requests[1][1][0]["labels"]["node"] == "n1"
    clock.t += 45
    d.run_once()
    assert len(transport.requests) == 3  # 65 s after the first re-send: again
    resolve(engine, ep, clock.t)
    clock.t += 20
    d.run_once()
    assert transport.requests[-1][1][0]["endsAt"] == rfc3339(clock.t - 20 - 1)
    clock.t += 60
    before = len(transport.requests)
    d.run_once()
    assert len(transport.requests) == before  # nothing active: nothing re-sent
