"""Two collector processes (`laggard server`) over one PostgreSQL: both ingest; one leads
detection and alert dispatch through the advisory lock; `kill -9` of the leader mid-ingest hands
the lead to the survivor, which continues the open episode, opens the next one and alerts each
change exactly once. Every acknowledged sample is in the database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
from sqlalchemy import create_engine, select, text

from server.detect.leader import ADVISORY_KEY
from server.settings import Settings
from server.store import schema
from tests.metrics.fleet import body
from tests.metrics.tools import Receiver, free_port, wait_http
from tests.server.payloads import encode

# Two collector processes, a kill -9 and the hand-over: about 40 s.
pytestmark = pytest.mark.slow

NODES = ("n1", "n2", "n3")
REPLICAS = ("replica-a", "replica-b")
LEADER_RETRY_S = 1.0


def stop_replicas(procs: dict[str, tuple[subprocess.Popen, str]]) -> None:
    """SIGTERM every replica still running; kill one that does not stop within 20 s."""
    for proc, _ in procs.values():
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


def start_replica(name: str, database_url: str, receiver_url: str, log_path, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = os.environ | {
        # application_name tells the replicas apart in pg_stat_activity (who holds the lock).
        "LAGGARD_DATABASE_URL": f"{database_url}?application_name={name}", "LAGGARD_PORT": str(port),
        "LAGGARD_DETECTION__OPEN_AFTER_S": "0", "LAGGARD_DETECTION__CLEAR_AFTER_S": "0", "LAGGARD_DETECTION_POLL_S": "0.05",
        "LAGGARD_LEADER_RETRY_S": str(LEADER_RETRY_S), "LAGGARD_RETENTION_INTERVAL_S": "3600",
        "LAGGARD_WEBHOOK_URLS": receiver_url, "LAGGARD_ALERTS__GROUP_WAIT_S": "0.2", "LAGGARD_ALERTS__POLL_S": "0.05",
        "LAGGARD_ALERTS__BACKOFF_INITIAL_S": "0.2", "LAGGARD_ALERTS__BACKOFF_MAX_S": "1",
    } | (env or {})
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "server.cli", "--log-level", "warning", "server"], env=env,
                                stdout=log, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


def lock_holder(engine) -> str | None:
    """application_name of the session holding the detector's advisory lock."""
    with engine.connect() as conn:
        return conn.execute(text(
            "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.objid = :k"
        ), {"k": ADVISORY_KEY & 0xFFFFFFFF}).scalar()


def wait_for(predicate, what: str, timeout: float = 60.0, explain=lambda: ""):
    # A generous deadline, not a timing assertion: takeover is bounded by LEADER_RETRY_S.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what} {explain()}")


class Fleet:
    """Pushes instant k of every node, alternating replicas; a refused or failed push is
    re-sent to the other replica, as an agent behind a load balancer would. Remembers what
    was acknowledged."""

    def __init__(self, urls: dict[str, str], t0: float):
        self.urls, self.t0 = urls, t0
        self.acked: set[tuple[str, float]] = set()
        self.turn = 0

    def push(self, k: int, hot: dict[str, tuple[int, ...]]) -> None:
        for node in NODES:
            content, headers = encode(body(node, self.t0 + k, self.t0, hot_gpus=hot.get(node, ())), gzipped=True)
            for attempt in range(len(self.urls) + 1):
                name = list(self.urls)[(self.turn + attempt) % len(self.urls)]
                try:
                    r = httpx.post(f"{self.urls[name]}/api/v1/samples", content=content, headers=headers, timeout=30)
                except httpx.TransportError:
                    continue
                if r.status_code == 200:
                    self.acked.add((node, self.t0 + k))
                    break
            else:
                raise AssertionError(f"no replica acknowledged {node} at instant {k}")
            self.turn += 1


def test_kill_9_of_the_leader_hands_over_without_loss_or_duplicates(postgres_url, tmp_path):
    receiver = Receiver()
    db = create_engine(Settings(database_url=postgres_url).database_url)
    # Both start at once: their migrations race and must serialise.
    procs = {name: start_replica(name, postgres_url, receiver.url, tmp_path / f"{name}.log") for name in REPLICAS}
    try:
        for name, (proc, url) in procs.items():
            wait_http(f"{url}/readyz", proc=proc)
        leader = wait_for(lambda: lock_holder(db), "a leader")
        survivor = next(n for n in REPLICAS if n != leader)
        fleet = Fleet({n: url for n, (_, url) in procs.items()}, t0=float(int(time.time()) - 120))

        for k in range(0, 10):
            fleet.push(k, hot={"n2": (3,)} if k >= 4 else {})
        firing = wait_for(lambda: [d for d in receiver.delivered() if d["status"] == "firing"], "the first alert")
        # One notification per receiver, cluster and cause: each alert in it has its own status.
        # The first alert was delivered (and recorded so) by the leader before it dies.
        wait_for(lambda: _states(db) == {"sent"}, "the delivery recorded as sent")
        assert [a["labels"]["node"] for d in firing for a in d["alerts"]] == ["n2"]

        # kill -9 while the fleet is pushing (the fault still there); pushes go on through the hand-over.
        acked = len(fleet.acked)
        pushing = threading.Thread(target=lambda: [fleet.push(k, hot={"n2": (3,)}) for k in range(10, 14)])
        pushing.start()
        wait_for(lambda: len(fleet.acked) > acked, "ingest under way")
        procs[leader][0].send_signal(signal.SIGKILL)
        procs[leader][0].wait(30)
        pushing.join(120)
        assert not pushing.is_alive() and {(n, fleet.t0 + 13) for n in NODES} <= fleet.acked
        assert wait_for(lambda: lock_holder(db) == survivor, "the survivor to take the lock")
        for k in range(14, 22):  # n2 recovers; n1 GPU 5 turns hot
            fleet.push(k, hot={"n1": (5,)} if k >= 16 else {})

        docs = wait_for(lambda: _done(receiver.delivered()), "the resolve and the second alert",
                        explain=lambda: _explain(db, receiver))
        wait_for(lambda: _states(db) == {"sent"}, "every delivery recorded as sent")
        time.sleep(1.0)  # a duplicate, if one were coming, would be sent by now (poll 0.05 s)
        docs = receiver.delivered()
        changes = sorted((a["labels"]["node"], a["labels"]["gpu"], a["status"]) for d in docs for a in d["alerts"])
        assert changes == [("n1", "5", "firing"), ("n2", "3", "firing"), ("n2", "3", "resolved")]

        with db.connect() as conn:
            eps = conn.execute(select(schema.Episode.__table__)).mappings().all()
            stored = set(conn.execute(text(
                "SELECT n.name, s.ts FROM gpu_samples s JOIN gpus g ON g.id = s.gpu_id JOIN nodes n ON n.id = g.node_id"
            )).all())
            per_instant = conn.execute(text("SELECT count(*) FROM gpu_samples")).scalar()
        # One episode per fault: the survivor continued n2's open episode instead of opening another.
        assert sorted((e["node"], e["gpu"], e["cause"], e["resolved_at"] is None) for e in eps) == [
            ("n1", 5, "thermal", True), ("n2", 3, "thermal", False)]
        assert fleet.acked <= {(node, ts) for node, ts in stored}
        assert per_instant == len(fleet.acked) * 8  # stored once each, 8 GPUs per sample
        assert procs[survivor][0].poll() is None
    finally:
        stop_replicas(procs)
        receiver.close()
        db.dispose()


def _states(db) -> set[str]:
    with db.connect() as conn:
        return set(conn.execute(select(schema.AlertDelivery.__table__.c.state)).scalars())


def _done(docs) -> bool:
    statuses = [(a["labels"]["node"], a["status"]) for d in docs for a in d["alerts"]]
    return ("n2", "resolved") in statuses and ("n1", "firing") in statuses


def _explain(db, receiver) -> str:
    """What the database and the receiver hold, for a failure message."""
    with db.connect() as conn:
        eps = conn.execute(text("SELECT node, gpu, cause, onset, resolved_at FROM episodes")).all()
        progress = conn.execute(text("SELECT key, value FROM detector_progress")).all()
        events = conn.execute(text("SELECT id, episode_id, change, alerted FROM episode_events")).all()
        outbox = conn.execute(text("SELECT id, episode_id, status FROM alert_outbox")).all()
        deliveries = conn.execute(text("SELECT outbox_id, state, attempts FROM alert_deliveries")).all()
    seen = [(a["labels"]["node"], a["status"]) for d in receiver.delivered() for a in d["alerts"]]
    return (f"episodes={eps} progress={progress} events={events} outbox={outbox} deliveries={deliveries} received={seen} "
            f"lock holder={lock_holder(db)}")
