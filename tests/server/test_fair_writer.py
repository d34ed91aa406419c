"""The ingest writer serves tokens in turn and commits large batches in slices (issue #12):
one token's largest batches no longer hold every other agent's push behind them."""

from __future__ import annotations

import json
import time

import pytest
from sqlalchemy import event, func, select

from server.ingest import decode_rows
from server.store import migrate, schema
from server.store.engine import make_engine
from server.store.fair_queue import CLOSED, FairQueue
from server.store.slices import GPU_WIDTH, row_count, split
from server.store.writer import IngestWriter
from tests.server.payloads import batch

FAIR_QUEUE_CASES = {
    "lanes are served in turn, each in its own order": (
        [("put", "a", 1), ("put", "a", 2), ("put", "a", 3), ("put", "b", 10), ("put", "c", 20), ("put", "b", 11)],
        [1, 10, 20, 2, 11, 3],
    ),
    "slices put in front are next in their lane": (
        [("put", "a", 1), ("put", "b", 10), ("get",), ("front", "a", [2, 3]), ("put", "a", 4)],
        [1, 10, 2, 3, 4],
    ),
    "a skipped lane waits": (
        [("put", "a", 1), ("put", "b", 10), ("skip", "a"), ("put", "a", 2)],
        [10, 1, 2],
    ),
}


@pytest.mark.parametrize("steps, expected", FAIR_QUEUE_CASES.values(), ids=FAIR_QUEUE_CASES.keys())
def test_fair_queue(steps, expected):
    q, got = FairQueue(), []
    for op, *args in steps:
        if op == "put":
            q.put(args[1], args[0])
        elif op == "front":
            q.put_front(args[1], args[0])
        elif op == "get":
            got.append(q.get(0))
        elif op == "skip":
            got.append(q.get(0, skip={args[0]}))
    q.close()
    while (item := q.get(0)) is not CLOSED:
        got.append(item)
    assert got == expected


def _unresolved(samples: int, gpus: int, node: str = "n1", ts: float | None = None):
    raw = json.dumps(batch(node=node, samples=samples, gpus=gpus, ts=ts)).encode()
    return decode_rows(raw, gzipped=False, limit=1 << 24, now=time.time(), max_future_skew_s=300)


@pytest.mark.parametrize("samples, gpus, max_rows, parts", [(100, 8, 200, 5), (3, 64, 10, 3), (10, 2, 1000, 1), (1, 64, 10, 1)])
def test_slices_hold_every_row_once(samples, gpus, max_rows, parts):
    whole = _unresolved(samples, gpus)
    slices = split(whole, max_rows)
    assert len(slices) == parts
    assert sum(s.samples for s in slices) == whole.samples and all(s.samples > 0 for s in slices)
    assert [r for s in slices for r in s.gpu_rows] == whole.gpu_rows
    assert [r for s in slices for r in s.nic_rows] == whole.nic_rows
    assert sum(row_count(s) for s in slices) == row_count(whole)
    assert min(s.min_ts for s in slices) == whole.min_ts and max(s.max_ts for s in slices) == whole.max_ts
    instants = [set(s.gpu_rows[1::GPU_WIDTH]) for s in slices]
    assert sum(map(len, instants)) == len(set().union(*instants)) == samples  # no instant cut in two


def test_a_small_push_is_committed_between_the_slices_of_a_large_one(database_url):
    engine = make_engine(database_url)
    migrate.upgrade(engine)
    writer = IngestWriter(engine, slice_rows=500)
    heavy = _unresolved(100, 64, node="heavy")  # 6,500 rows: 13 slices
    light = _unresolved(1, 2, node="light")
    order: list[str] = []
    # Both queued before the writer starts: the heavy batch first, as if it had come first.
    heavy_done = writer.submit(lambda: heavy, "heavy-token")
    light_done = writer.submit(lambda: light, "light-token")
    heavy_done.add_done_callback(lambda _: order.append("heavy"))
    light_done.add_done_callback(lambda _: order.append("light"))
    writer.start()
    try:
        assert heavy_done.result(60) == 100 and light_done.result(60) == 1
    finally:
        writer.stop()
    assert order == ["light", "heavy"]
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(schema.GpuSample)).scalar() == 100 * 64 + 2
    engine.dispose()


def test_registering_new_names_counts_in_the_size_of_a_group(database_url):
    """Thirty new node names in one transaction held the writer for 190 ms: a batch that
    registers its node, GPUs and ports weighs more than its rows; once known, only its rows."""
    engine = make_engine(database_url)
    migrate.upgrade(engine)
    commits: list[int] = []
    event.listen(engine, "commit", lambda _conn: commits.append(1))
    ids, transactions = None, []
    for ts in (time.time() - 60, time.time() - 30):
        # 3 rows each (2 GPUs, 1 port): 30 rows fit in a group of 2 x 64, but not 10 x 4 new names.
        batches = [_unresolved(1, 2, node=f"new-{i}", ts=ts) for i in range(10)]
        writer = IngestWriter(engine, slice_rows=64)
        writer.ids = ids or writer.ids  # the second round knows the names the first registered
        done = [writer.submit(lambda b=b: b, f"token-{i}") for i, b in enumerate(batches)]
        before = len(commits)
        writer.start()
        try:
            assert [d.result(60) for d in done] == [1] * 10
        finally:
            writer.stop()
        transactions.append(len(commits) - before)
        ids = writer.ids
    assert transactions == [10, 1]
    engine.dispose()
