"""`laggard server --workers 2` on SQLite: the workers decode, one writer process commits
(server/store/writer_service.py). Real processes, real HTTP."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from sqlalchemy import select

from server.store import schema
from server.store.engine import make_engine
from tests.server.conftest import count_rows, stored_gpu_samples
from tests.server.payloads import batch

# Recent enough that retention (7 days), which every worker runs as it starts, keeps them.
T0 = time.time() - 3600
WRITER_LINE = re.compile(r"ingest writer process (\d+) at ")


class Collector:
    def __init__(self, database_url: str, port: int):
        env = os.environ | {"LAGGARD_DETECTION_ENABLED": "false", "LAGGARD_RETENTION_INTERVAL_S": "3600"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "server.cli", "--log-level", "info", "server", "--workers", "2", "--port", str(port),
             "--database-url", database_url],
            env=env, stderr=subprocess.PIPE, text=True,
        )
        self.url = f"http://127.0.0.1:{port}"
        self.writer_pids: list[int] = []
        self.log: list[str] = []
        threading.Thread(target=self._read_log, daemon=True).start()

    def _read_log(self) -> None:
        for line in self.proc.stderr:
            self.log.append(line)
            if m := WRITER_LINE.search(line):
                self.writer_pids.append(int(m.group(1)))

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "".join(self.log)
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise AssertionError("collector not ready:\n" + "".join(self.log))

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)


@contextlib.contextmanager
def running_collector(database_url: str):
    c = Collector(database_url, _unused_port())
    try:
        c.wait_ready()
        yield c
    finally:
        if c.proc.poll() is None:
            c.stop()
        print("".join(c.log))  # shown by pytest when the test failed


@pytest.fixture
def collector(sqlite_url):
    """A collector of the test's own (one whose writer process it kills)."""
    with running_collector(sqlite_url) as c:
        yield c


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """(collector, its database URL) for the tests that only push to it: each counts the rows its
    own pushes added."""
    url = f"sqlite:///{tmp_path_factory.mktemp('writer') / 'laggard.db'}"
    with running_collector(url) as c:
        yield c, url


def _unused_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _counts(database_url: str) -> tuple[int, int, int]:
    """(GPU samples, nodes, GPUs) stored."""
    engine = make_engine(database_url)
    try:
        return stored_gpu_samples(engine), count_rows(engine, schema.Node), count_rows(engine, schema.Gpu)
    finally:
        engine.dispose()


def _post(client: httpx.Client, body: dict) -> httpx.Response:
    return client.post("/api/v1/samples", content=json.dumps(body), headers={"content-type": "application/json"})


def test_batches_from_many_nodes_are_committed_by_the_writer_process(shared):
    collector, url = shared
    before = _counts(url)
    bodies = [batch(node=f"n{n:02d}", samples=3, gpus=4, ts=T0 + 10 * r) for n in range(8) for r in range(5)]
    with httpx.Client(base_url=collector.url, timeout=30) as client, ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda b: _post(client, b), bodies))
    assert [a.status_code for a in answers] == [200] * len(bodies)
    assert sum(a.json()["accepted"] for a in answers) == 3 * len(bodies)
    samples, nodes, gpus = (after - was for after, was in zip(_counts(url), before, strict=True))
    assert samples == 8 * 5 * 3 * 4
    assert nodes == 8
    assert gpus == 8 * 4
    assert len(collector.writer_pids) == 1 and collector.writer_pids[0] != collector.proc.pid


def test_a_bad_batch_is_refused_by_the_worker_and_stores_nothing(shared):
    collector, url = shared
    before = _counts(url)
    bad = batch(node="bad")
    bad["samples"][0]["gpus"][0]["temp_c"] = "hot"
    with httpx.Client(base_url=collector.url, timeout=30) as client:
        answer = _post(client, bad)
    assert answer.status_code == 422
    assert answer.json()["detail"][0]["loc"] == ["body", "samples", 0, "gpus", 0, "temp_c"]
    assert _counts(url) == before


def test_a_killed_writer_process_means_503s_then_a_new_writer_and_no_acknowledged_sample_lost(collector, sqlite_url):
    acknowledged: list[dict] = []
    statuses: list[int] = []
    first_writer = collector.writer_pids[0]
    with httpx.Client(base_url=collector.url, timeout=30) as client:
        for r in range(5):
            body = batch(node="steady", samples=2, gpus=2, ts=T0 + 10 * r)
            assert _post(client, body).status_code == 200
            acknowledged.append(body)
        os.kill(first_writer, signal.SIGKILL)
        deadline = time.monotonic() + 60
        r = 5
        while time.monotonic() < deadline:
            body = batch(node="steady", samples=2, gpus=2, ts=T0 + 10 * r)
            answer = _post(client, body)
            statuses.append(answer.status_code)
            if answer.status_code == 200:
                acknowledged.append(body)
                r += 1  # only then: a slow restart must not walk ts past the future-timestamp limit
                if len(collector.writer_pids) > 1:
                    break
            else:
                time.sleep(0.1)
    assert len(collector.writer_pids) > 1, "".join(collector.log)
    # While no writer was there the workers said "try again" (503), never 500.
    assert set(statuses) <= {200, 503}, statuses
    assert 503 in statuses
    engine = make_engine(sqlite_url)
    try:
        with engine.connect() as conn:
            stored = set(conn.execute(select(schema.Gpu.uuid, schema.GpuSample.ts).join(schema.Gpu, schema.Gpu.id == schema.GpuSample.gpu_id)).all())
        wanted = {(g["uuid"], s["ts"]) for b in acknowledged for s in b["samples"] for g in s["gpus"]}
        assert wanted <= stored
    finally:
        engine.dispose()
    code = collector.stop()
    assert code == 0, "".join(collector.log)


def test_a_uuid_claimed_by_a_second_live_node_is_a_conflict_through_the_writer_process(shared):
    collector, url = shared
    before = _counts(url)
    holder = batch(node="holder", samples=2, gpus=1, ts=T0)
    claimant = batch(node="claimant", samples=2, gpus=1, ts=T0)
    claimant["samples"] = [{**s, "gpus": [dict(s["gpus"][0], uuid=holder["samples"][0]["gpus"][0]["uuid"])]} for s in claimant["samples"]]
    with httpx.Client(base_url=collector.url, timeout=30) as client:
        assert _post(client, holder).status_code == 200
        answer = _post(client, claimant)
    assert answer.status_code == 409, answer.text
    assert "'holder'" in answer.json()["detail"][0]["msg"] and "'claimant'" in answer.json()["detail"][0]["msg"]
    assert _counts(url)[0] - before[0] == 2
