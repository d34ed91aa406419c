"""Webhooks end to end (SQLite and PostgreSQL): samples pushed over HTTP open an episode, the
collector POSTs a signed Alertmanager-style payload to a local receiver, retries when the
receiver fails, delivers after a restart what it could not deliver before, and never logs a
secret."""

from __future__ import annotations

import logging
import time

from server.alerts import signing
from server.alerts.settings import AlertSettings
from server.app import create_app
from server.detect.settings import DetectionSettings
from server.serve import start_in_thread
from server.settings import Settings
from tests.metrics.fleet import push_range
from tests.metrics.tools import Receiver, values

SECRET = "hook-s3cret-value"


def settings_for(url: str, receiver_url: str, **alerts) -> Settings:
    return Settings(
        database_url=url, detection=DetectionSettings(open_after_s=0, clear_after_s=0), detection_poll_s=0.05, retention_interval_s=3600,
        webhook_urls=receiver_url, webhook_secret=SECRET,
        alerts=AlertSettings(**({"group_wait_s": 0.5, "poll_s": 0.05, "backoff_initial_s": 0.2, "backoff_max_s": 1.0} | alerts)),
    )


def firing(docs):
    return [d for d in docs if d["status"] == "firing"]


def test_open_and_resolve_are_posted_signed(database_url):
    receiver = Receiver()
    t0 = float(int(time.time()) - 60)
    server = start_in_thread(create_app(settings_for(database_url, receiver.url, external_url="https://laggard.example")))
    try:
        push_range(server.url, t0, 0, 5)
        push_range(server.url, t0, 5, 10, hot={"n2": (3,)})
        docs = receiver.wait(lambda d: firing(d))
        (doc,) = firing(docs)
        raw = next(r for r in receiver.requests if not r["failed"])
        assert signing.verify(raw["body"], raw["headers"]["X-Laggard-Signature"], SECRET)
        assert raw["headers"]["Content-Type"] == "application/json"
        assert doc["version"] == "4" and doc["receiver"] == "webhook-1" and doc["externalURL"] == "https://laggard.example"
        (alert,) = doc["alerts"]
        assert alert["labels"] == {"alertname": "LaggardStraggler", "cluster": "prod", "node": "n2", "gpu": "3", "cause": "thermal",
                                   "severity": "critical"}
        assert "1400 MHz" in alert["annotations"]["summary"] and '"sm_clock_mhz":1400' in alert["annotations"]["evidence"]
        assert alert["endsAt"] == "0001-01-01T00:00:00Z" and alert["generatorURL"].startswith("https://laggard.example/")

        push_range(server.url, t0, 10, 18)  # cools down
        docs = receiver.wait(lambda d: any(x["status"] == "resolved" for x in d))
        (resolved,) = [d for d in docs if d["status"] == "resolved"]
        assert resolved["alerts"][0]["fingerprint"] == alert["fingerprint"]
        assert resolved["alerts"][0]["endsAt"] != "0001-01-01T00:00:00Z"
        time.sleep(1.0)
        assert len(receiver.delivered()) == 2  # once each
        body = __import__("httpx").get(f"{server.url}/metrics").text
        assert values(body, "laggard_alert_notifications_total", receiver="webhook-1", result="sent") == [2]
        assert values(body, "laggard_alert_deliveries_pending", receiver="webhook-1") == [0]
    finally:
        server.stop()
        receiver.close()


def test_a_storm_in_one_cluster_is_one_notification(database_url):
    receiver = Receiver()
    t0 = float(int(time.time()) - 60)
    nodes = ("n1", "n2", "n3", "n4")
    server = start_in_thread(create_app(settings_for(database_url, receiver.url, group_wait_s=2.0)))
    try:
        push_range(server.url, t0, 0, 5, nodes=nodes)
        # Three GPUs on three nodes run hot at once: thermal, cluster prod.
        push_range(server.url, t0, 5, 10, nodes=nodes, hot={"n1": (1,), "n2": (3,), "n4": (0,)})
        docs = receiver.wait(lambda d: sum(len(x["alerts"]) for x in firing(d)) >= 3)
        time.sleep(1.0)
        docs = receiver.delivered()
        assert len(docs) == 1, [[a["labels"]["node"] for a in d["alerts"]] for d in docs]
        assert sorted((a["labels"]["node"], a["labels"]["gpu"]) for a in docs[0]["alerts"]) == [("n1", "1"), ("n2", "3"), ("n4", "0")]
        assert docs[0]["groupLabels"] == {"cluster": "prod", "cause": "thermal"}
    finally:
        server.stop()
        receiver.close()


def test_retries_until_the_receiver_answers(database_url, caplog):
    receiver = Receiver()
    receiver.fail_next = 3
    t0 = float(int(time.time()) - 60)
    hook = receiver.url + "/hooks/tok-123?key=abc"
    server = start_in_thread(create_app(settings_for(database_url, hook)))
    caplog.set_level(logging.DEBUG)
    try:
        push_range(server.url, t0, 0, 5)
        push_range(server.url, t0, 5, 10, hot={"n2": (3,)})
        docs = receiver.wait(lambda d: firing(d), timeout=30)
        assert len(firing(docs)) == 1
        attempts = [r for r in receiver.requests]
        assert [r["failed"] for r in attempts] == [True, True, True, False]
        # The same signed body every time (a receiver deduplicates on the fingerprint).
        assert len({r["body"] for r in attempts}) == 1
        gaps = [b["at"] - a["at"] for a, b in zip(attempts, attempts[1:])]
        assert gaps[0] >= 0.1 - 0.02 and gaps[1] >= 0.2 - 0.02 and gaps[2] >= 0.4 - 0.02  # 0.2 s doubling, jitter 0.5-1.0
        assert "alert delivery to receiver webhook-1 failed (HTTP 500)" in caplog.text
        for secret in (SECRET, "tok-123", "key=abc", signing.sign(attempts[0]["body"], SECRET)):
            assert secret not in caplog.text
    finally:
        server.stop()
        receiver.close()


def test_a_restart_loses_no_pending_alert(database_url):
    receiver = Receiver()
    receiver.status = 503  # down: nothing gets through
    t0 = float(int(time.time()) - 60)
    settings = settings_for(database_url, receiver.url)
    server = start_in_thread(create_app(settings))
    try:
        push_range(server.url, t0, 0, 5)
        push_range(server.url, t0, 5, 10, hot={"n2": (3,)})
        deadline = time.monotonic() + 20
        while not receiver.requests and time.monotonic() < deadline:
            time.sleep(0.05)
        assert receiver.requests, "the collector never tried"
    finally:
        server.stop()
    assert receiver.delivered() == []
    receiver.status = 200
    tried = len(receiver.requests)
    server = start_in_thread(create_app(settings))
    try:
        docs = receiver.wait(lambda d: firing(d))
        (doc,) = firing(docs)
        assert doc["alerts"][0]["labels"]["node"] == "n2"
        assert len(receiver.requests) > tried
    finally:
        server.stop()
        receiver.close()
