"""The ingest writer serves tokens in turn and commits large batches in slices (issue #12):
one token's largest batches no longer hold every other agent's push behind them."""

from __future__ import annotations

import json
import time

import pytest
from sqlalchemy import event, func, select

from server.ingest.decode import decode_rows
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
    # Jobs of 100 and more are heavy here.
    "a lane whose next job is heavy waits while light ones are served, and keeps its order": (
        [("put", "a", 100), ("put", "b", 1), ("put", "a", 2), ("put", "c", 101), ("put", "b", 3)],
        [1, 3, 100, 2, 101],
    ),
    "heavy first when asked, light only when no heavy": (
        [("put", "a", 1), ("put", "b", 100), ("heavy_first",), ("heavy_first",), ("put", "a", 2)],
        [100, 1, 2],
    ),
}


@pytest.mark.parametrize("steps, expected", FAIR_QUEUE_CASES.values(), ids=FAIR_QUEUE_CASES.keys())
def test_fair_queue(steps, expected):
    q, got = FairQueue(heavy=lambda item: item >= 100), []
    for op, *args in steps:
        if op == "put":
            q.put(args[1], args[0])
        elif op == "front":
            q.put_front(args[1], args[0])
        elif op == "get":
            got.append(q.get(0))
        elif op == "skip":
            got.append(q.get(0, skip={args[0]}))
        elif op == "heavy_first":
            got.append(q.get(0, heavy_first=True))
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


@pytest.mark.parametrize("small_rows", [64, 0], ids=["small pushes first", "no priority"])
def test_registering_new_names_counts_in_the_size_of_a_group(database_url, small_rows):
    """Thirty new node names in one transaction held the writer for 190 ms: a batch that
    registers its node, GPUs and ports weighs more than its rows (heavy, with the priority of
    small pushes: alone); once known, only its rows."""
    engine = make_engine(database_url)
    migrate.upgrade(engine)
    commits: list[int] = []
    event.listen(engine, "commit", lambda _conn: commits.append(1))
    ids, transactions = None, []
    for ts in (time.time() - 60, time.time() - 30):
        # 3 rows each (2 GPUs, 1 port): 30 rows fit in a group of 128, but not 10 x 4 new names.
        batches = [_unresolved(1, 2, node=f"new-{i}", ts=ts) for i in range(10)]
        writer = IngestWriter(engine, slice_rows=64, small_rows=small_rows, group_rows=128)
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


def _recording_groups(writer: IngestWriter, during_first=None) -> list[list[str]]:
    """Each transaction's batches, by node, in commit order; `during_first` runs inside the first."""
    groups: list[list[str]] = []
    transaction = writer._transaction

    def recorded(jobs):
        groups.append([job.batch.node for job in jobs])
        if during_first is not None and len(groups) == 1:
            during_first()
        return transaction(jobs)

    writer._transaction = recorded
    return groups


def test_a_small_push_is_not_queued_behind_heavy_slices_nor_committed_with_one(database_url):
    """Issue #12: a small push that arrives while heavy tokens' slices wait is the next
    transaction, alone (before: it waited for a slice of every heavy lane in turn, and then
    shared the transaction of the next one, 50-100 ms on the shared machine)."""
    engine = make_engine(database_url)
    migrate.upgrade(engine)
    writer = IngestWriter(engine, slice_rows=500)
    heavy = {f"heavy-{k}": _unresolved(100, 64, node=f"heavy-{k}") for k in range(3)}  # 6,500 rows: 13 slices each
    light = _unresolved(1, 2, node="light")
    light_done: list = []
    groups = _recording_groups(writer, during_first=lambda: light_done.append(writer.submit(lambda: light, "light-token")))
    heavy_done = [writer.submit(lambda b=b: b, f"{node}-token") for node, b in heavy.items()]
    writer.start()
    try:
        assert [d.result(60) for d in heavy_done] == [100] * 3 and light_done[0].result(60) == 1
    finally:
        writer.stop()
    assert "light" not in groups[0]  # submitted while the first slice was being written
    assert groups[1] == ["light"], groups[:4]
    assert all(g == ["light"] or "light" not in g for g in groups)
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(schema.GpuSample)).scalar() == 3 * 100 * 64 + 2
    engine.dispose()


def test_heavy_slices_still_progress_while_small_pushes_keep_coming(database_url):
    """Small pushes first, but not for ever: once heavy slices have waited `heavy_wait_s`, one
    is committed even though a small push waits (here 0 s: at once). Without that, the small
    pushes that keep coming would hold the heavy batch back for ever."""
    engine = make_engine(database_url)
    migrate.upgrade(engine)
    writer = IngestWriter(engine, slice_rows=500, heavy_wait_s=0.0)
    heavy = _unresolved(20, 64, node="heavy")  # 1,300 rows: 3 slices
    groups = _recording_groups(writer)
    transaction = writer._transaction
    small_done = []

    def one_more_small_push(jobs):  # a small push waits whenever a group is gathered, until the heavy batch is stored
        if not heavy_done.done():
            small_done.append(writer.submit(lambda n=len(small_done): _unresolved(1, 2, node=f"light-{n % 2}"), "light-token"))
        return transaction(jobs)

    writer._transaction = one_more_small_push
    heavy_done = writer.submit(lambda: heavy, "heavy-token")
    small_done.append(writer.submit(lambda: _unresolved(1, 2, node="light-0"), "light-token"))
    writer.start()
    try:
        assert heavy_done.result(60) == 20
    finally:
        writer.stop()
    assert all(d.result(0) == 1 for d in small_done)
    heavy_groups = [i for i, g in enumerate(groups) if g == ["heavy"]]
    assert len(heavy_groups) == 3 and heavy_groups[-1] <= 8, groups
    engine.dispose()


def test_a_tokens_heavy_push_and_the_light_ones_behind_it_keep_their_order(database_url):
    """One lane (one token, or none) with a heavy push first: it is committed, alone, then the
    light ones after it; the light ones do not overtake it, and nothing waits for ever."""
    engine = make_engine(database_url)
    migrate.upgrade(engine)
    writer = IngestWriter(engine, slice_rows=500, small_rows=200)
    groups = _recording_groups(writer)
    first = _unresolved(1, 8, node="new-node")  # its node, 8 GPUs and port new: 9 + 10 x 32 rows, heavy
    done = [writer.submit(lambda: first)] + [writer.submit(lambda n=n: _unresolved(1, 2, node=f"light-{n}")) for n in range(3)]
    writer.start()
    try:
        assert [d.result(30) for d in done] == [1] * 4
    finally:
        writer.stop()
    assert groups[0] == ["new-node"] and sorted(n for g in groups[1:] for n in g) == ["light-0", "light-1", "light-2"]
    engine.dispose()
