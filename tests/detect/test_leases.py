"""Cluster leases (server/detect/leases.py) and the claim that fences a holder's commits
(server/detect/shard.py): even shares, takeover when a lock session dies, an older leader
respected, a stale holder's commit refused."""

from __future__ import annotations

import random
import time

import pytest
from sqlalchemy import text

from server.detect.leader import ADVISORY_KEY, LeaderLock
from server.detect.leases import ClusterLeases, plan
from server.detect.settings import DetectionSettings
from server.detect.shard import Fenced, Shard
from server.store import schema
from server.store.detector_state import LockView, bucket, holder_names
from server.store.engine import make_engine

CLUSTERS = {"alpha", "bravo", "charlie", "delta"}


def _poll_round(replicas: list[int], holders: dict[int, int], buckets: set[int], rng: random.Random) -> None:
    for me in rng.sample(replicas, len(replicas)):
        release, candidates, want = plan(me=me, view=LockView(set(replicas), dict(holders), {}, False), buckets=buckets)
        for key in release:
            del holders[key]
        for key in candidates[:want]:
            holders.setdefault(key, me)


@pytest.mark.parametrize("seed", range(20))
def test_replicas_joining_one_by_one_end_with_even_shares_and_survivors_take_all(seed):
    rng = random.Random(seed)
    buckets = set(rng.sample(range(1, 1 << 32), rng.randint(1, 12)))
    replicas, holders = [], {}
    for pid in range(100, 100 + rng.randint(2, 5)):
        replicas.append(pid)  # the first to come takes everything; the others must get their share
        _poll_round(replicas, holders, buckets, rng)
    for _ in range(4):
        _poll_round(replicas, holders, buckets, rng)
    m, n = len(buckets), len(replicas)
    shares = sorted(sum(1 for p in holders.values() if p == r) for r in replicas)
    assert sum(shares) == m and set(shares) <= {m // n, -(-m // n)}, shares
    dead = max(replicas, key=lambda r: shares.count(r))
    replicas.remove(dead)
    holders = {b: p for b, p in holders.items() if p != dead}
    _poll_round(replicas, holders, buckets, rng)  # one poll of each survivor is enough
    assert set(holders) == buckets


def test_three_replicas_four_clusters_two_one_one():
    holders = {bucket(c): 1 for c in CLUSTERS}  # one replica alone took all four
    rng = random.Random(0)
    for _ in range(3):
        _poll_round([1, 2, 3], holders, {bucket(c) for c in CLUSTERS}, rng)
    assert sorted(sum(1 for p in holders.values() if p == r) for r in (1, 2, 3)) == [1, 1, 2]


@pytest.fixture
def pg_engine(postgres_url):
    engine = make_engine(postgres_url)
    yield engine
    engine.dispose()


def test_lock_sessions_share_the_clusters_and_a_dead_one_hands_them_over(pg_engine):
    replicas = [ClusterLeases(pg_engine) for _ in range(3)]
    try:
        for _ in range(3):
            for r in replicas:
                r.poll(CLUSTERS)
        held = [r.poll(CLUSTERS) for r in replicas]
        assert sorted(len(h) for h in held) == [1, 1, 2] and set().union(*held) == CLUSTERS
        with pg_engine.connect() as conn:
            names = holder_names(conn)
        assert {bucket(c) for c in CLUSTERS} == set(names)
        biggest = max(replicas, key=lambda r: len(r.buckets))
        biggest.release()  # its session ends, as when its process is killed
        survivors = [r for r in replicas if r is not biggest]
        deadline = time.monotonic() + 5
        while True:  # the server ends the session a moment after the socket closes
            held = [r.poll(CLUSTERS) for r in survivors]
            if set().union(*held) == CLUSTERS or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert sorted(len(h) for h in held) == [2, 2] and set().union(*held) == CLUSTERS
    finally:
        for r in replicas:
            r.release()


def test_no_cluster_is_judged_while_an_older_version_leads(pg_engine):
    older = pg_engine.connect()  # a leader that knows nothing of leases: it judges every cluster
    older.execute(text("SELECT pg_advisory_lock(:k)"), {"k": ADVISORY_KEY})
    older.commit()
    replica = ClusterLeases(pg_engine)
    try:
        assert replica.poll(CLUSTERS) == set()
        older.invalidate()
        older.close()
        leader = LeaderLock(pg_engine)  # a leader of this version marks itself as sharding
        assert leader.try_acquire()
        assert replica.poll(CLUSTERS) == CLUSTERS
        leader.release()
    finally:
        replica.release()


def test_a_stale_holder_cannot_commit_after_another_claimed_the_cluster(migrated_engine):
    cfg = DetectionSettings()
    stale = Shard.claim(migrated_engine, "alpha", cfg)
    fresh = Shard.claim(migrated_engine, "alpha", cfg)
    assert fresh.epoch == stale.epoch + 1
    with pytest.raises(Fenced), migrated_engine.begin() as conn:
        stale.fence(conn)
        stale.save(conn, {"judged_until:alpha": 123.0})
    with migrated_engine.begin() as conn:
        fresh.fence(conn)
        fresh.save(conn, {"judged_until:alpha": 100.0})
    with migrated_engine.connect() as conn:
        progress = dict(conn.execute(text(f"SELECT key, value FROM {schema.DetectorProgress.__tablename__}")).all())
    assert progress["judged_until:alpha"] == 100.0 and progress["lease_epoch:alpha"] == fresh.epoch


def test_a_new_holder_starts_where_the_cluster_was_read_to(migrated_engine):
    """Its own position; else, judged before sharding, the old shared one; else, never judged,
    before its first entry still in the log."""
    from server.detect.source import LogCursor, take_clusters

    nodes, log, progress = schema.Node.__table__, schema.IngestLog.__table__, schema.DetectorProgress.__table__
    with migrated_engine.begin() as conn:
        for i, cluster in enumerate(("a", "b", "c"), start=1):
            conn.execute(nodes.insert().values(id=i, cluster=cluster, name="n1", labels={}, first_seen=0.0, last_seen=0.0))
        for entry, node in enumerate((1, 1, 1, 2, 1, 2, 3, 3), start=1):  # b's first entry is 4, c's 7
            conn.execute(log.insert().values(id=entry, node_id=node, min_ts=0.0, max_ts=0.0, samples=1, committed_at=0.0))
        for key, value in (("ingest_log.low_water", 5.0), ("judged_until:a", 1.0), ("ingest_log.low_water:c", 6.0)):
            conn.execute(progress.insert().values(key=key, value=value))
    cfg = DetectionSettings()
    assert Shard.claim(migrated_engine, "a", cfg).cursor.low_water == 5  # the shared position of before
    assert Shard.claim(migrated_engine, "b", cfg).cursor.low_water == 3  # just before its first entry
    assert Shard.claim(migrated_engine, "c", cfg).cursor.low_water == 6  # its own
    cursors = {"a": LogCursor(low_water=0), "b": LogCursor(low_water=3), "c": LogCursor(low_water=6)}
    with migrated_engine.connect() as conn:
        got = take_clusters(conn, cursors)
    assert {c: [e["id"] for e in entries] for c, entries in got.items()} == {"a": [1, 2, 3, 5], "b": [4, 6], "c": [7, 8]}
    assert {c: cursor.low_water for c, cursor in cursors.items()} == {"a": 8, "b": 8, "c": 8}
