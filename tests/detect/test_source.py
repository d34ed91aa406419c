"""What the detector reads of the ingest log and the rows behind it: one committed state, never
half of a batch that committed while it was reading."""

from __future__ import annotations

import time

import httpx
import pytest

from server.app import create_app
from server.detect import source
from server.detect.source import LogCursor, read_committed
from server.serve import start_in_thread
from server.settings import Settings
from server.store.driver_rows import select_rows
from server.store.engine import make_engine
from tests.server.payloads import batch, encode

T0 = float(int(time.time()) - 600)


@pytest.fixture
def settings(database_url):
    # Nothing but this test reads the log: the collector only stores.
    return Settings(database_url=database_url, retention_interval_s=3600, rollup_interval_s=3600, detector={"enabled": False})


@pytest.fixture
def db(settings):
    engine = make_engine(settings.database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def collector(settings):
    running = start_in_thread(create_app(settings))
    yield running
    running.stop()


def _push(url: str, body: dict) -> None:
    content, headers = encode(body, gzipped=True)
    r = httpx.post(f"{url}/api/v1/samples", content=content, headers=headers, timeout=30)
    assert r.status_code == 200, r.text


def test_a_batch_committed_between_two_reads_is_read_whole_or_not_at_all(collector, db, monkeypatch):
    """A node's batches can commit out of order (two in flight at once, PostgreSQL committing
    ids out of order). One committing between the read of the GPU rows and that of the port
    rows gave instants with ports and no GPUs: all of the node's GPUs looked lost, and the
    GPU rows, read later, were already behind the node's judged instants."""
    node = dict(node="n1", cluster="c1", gpus=2)
    _push(collector.url, batch(samples=3, ts=T0, **node))
    _push(collector.url, batch(samples=3, ts=T0 + 6, **node))
    late_batch = batch(samples=3, ts=T0 + 3, **node)

    pushed: list[bool] = []

    def push_once_the_gpu_rows_were_read(conn, stmt):
        rows = select_rows(conn, stmt)
        if "gpu_samples" in str(stmt) and not pushed:
            pushed.append(True)
            _push(collector.url, late_batch)
        return rows

    monkeypatch.setattr(source, "select_rows", push_once_the_gpu_rows_were_read)
    instants = read_committed(db, {"c1": LogCursor()}, keep=lambda _cluster, entries: entries)["c1"]

    assert pushed, "the late batch was not pushed while reading"
    shapes = {item.ts - T0: (len(item.gpu_rows), len(item.nic_rows)) for item in instants}
    assert set(shapes.values()) == {(2, 1)}, shapes
    assert sorted(shapes) in ([0, 1, 2, 6, 7, 8], [0, 1, 2, 3, 4, 5, 6, 7, 8])
