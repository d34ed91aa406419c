"""Sample tables partitioned by day on PostgreSQL (migration 0004, server/store/partitions.py):
the migration keeps every row both ways, a sample no day partition covers lands in the default
partition (never refused) and moves when its day is created, range queries read across day
boundaries and touch only the partitions of their range, and retention drops whole days."""

from __future__ import annotations

import time

import httpx
import pytest
from alembic import command
from sqlalchemy import text

from server.app import create_app
from server.serve import start_in_thread
from server.settings import Settings
from server.store import migrate, partitions
from server.store.engine import make_engine
from server.store.retention import Horizons, apply_retention
from tests.server.payloads import batch, encode

DAY = partitions.DAY_S


@pytest.fixture
def pg(postgres_url):
    settings = Settings(database_url=postgres_url, retention_interval_s=3600)
    server = start_in_thread(create_app(settings))
    engine = make_engine(settings.database_url)
    yield server, engine
    server.stop()
    engine.dispose()


def push(url: str, body: dict) -> None:
    content, headers = encode(body, gzipped=True)
    r = httpx.post(f"{url}/api/v1/samples", content=content, headers=headers, timeout=30)
    assert r.status_code == 200, r.text


def where_rows_are(engine, table: str = "gpu_samples") -> dict[str, int]:
    with engine.connect() as conn:
        return dict(conn.execute(text(f"SELECT tableoid::regclass::text, count(*) FROM {table} GROUP BY 1")).all())


def today() -> int:
    return int(time.time() // DAY) * DAY


def test_tables_are_partitioned_with_days_ahead_and_a_default(pg):
    _, engine = pg
    with engine.connect() as conn:
        for table in partitions.TABLES:
            assert partitions.is_partitioned(conn, table)
            days = partitions.day_partitions(conn, table)
            want = {partitions.day_partition(table, today() + k * DAY) for k in range(-1, partitions.DAYS_AHEAD + 1)}
            assert want <= set(days)
            assert days[partitions.day_partition(table, today())] == (float(today()), float(today() + DAY))
            assert conn.execute(text("SELECT to_regclass(:n)"), {"n": partitions.default_partition(table)}).scalar()


def test_a_sample_no_day_covers_goes_to_default_then_moves_to_its_day(pg):
    server, engine = pg
    old = today() - 5 * DAY + 3600.0
    push(server.url, batch(samples=3, gpus=2, ts=old))
    assert where_rows_are(engine) == {"gpu_samples_default": 6}

    created = partitions.ensure_partitions(engine, now=old, days_back=0, days_ahead=0)

    day = partitions.day_partition("gpu_samples", today() - 5 * DAY)
    assert day in created
    assert where_rows_are(engine) == {day: 6}
    assert where_rows_are(engine, "nic_samples") == {partitions.day_partition("nic_samples", today() - 5 * DAY): 3}
    assert partitions.ensure_partitions(engine, now=old, days_back=0, days_ahead=0) == []  # idempotent


def test_series_across_midnight_reads_both_days_and_prunes_the_rest(pg):
    server, engine = pg
    midnight = float(today())
    body = batch(samples=6, gpus=1, ts=midnight - 3)
    push(server.url, body)
    assert set(where_rows_are(engine)) == {partitions.day_partition("gpu_samples", today() - DAY),
                                           partitions.day_partition("gpu_samples", today())}
    uuid = body["samples"][0]["gpus"][0]["uuid"]
    r = httpx.get(f"{server.url}/api/v1/gpus/{uuid}/series", params={"metric": "sm_clock_mhz", "since": midnight - 2, "until": midnight + 1})
    assert r.status_code == 200, r.text
    assert [p[0] if isinstance(p, list) else p["ts"] for p in r.json()["points"]] == [midnight - 2, midnight - 1, midnight, midnight + 1]
    node = httpx.get(f"{server.url}/api/v1/nodes/{body['node']}").json()
    assert node["gpus"][0]["latest"]["ts"] == midnight + 2  # the newest sample, from today's partition

    with engine.connect() as conn:
        plan = "\n".join(conn.execute(text(
            "EXPLAIN SELECT ts, sm_clock_mhz FROM gpu_samples WHERE gpu_id = 1 AND ts >= :lo AND ts <= :hi ORDER BY ts"
        ), {"lo": midnight + 10, "hi": midnight + 3600}).scalars())
    touched = {name for name in partitions_in(plan)}
    assert touched == {partitions.day_partition("gpu_samples", today())}, plan


def partitions_in(plan: str) -> set[str]:
    return {word for word in plan.replace("(", " ").split() if partitions.is_partition_name(word)}


def test_retention_drops_whole_day_partitions_and_old_rows_of_the_default(pg):
    server, engine = pg
    now = time.time()
    nine_days_ago = today() - 9 * DAY
    partitions.ensure_partitions(engine, now=nine_days_ago, days_back=0, days_ahead=0)
    push(server.url, batch(samples=3, gpus=2, ts=nine_days_ago + 60))   # its day partition
    push(server.url, batch(samples=2, gpus=2, ts=today() - 12 * DAY))   # the default partition
    push(server.url, batch(samples=2, gpus=2, ts=now - 60))             # today's partition
    old_day = partitions.day_partition("gpu_samples", nine_days_ago)
    assert where_rows_are(engine)[old_day] == 6

    deleted = apply_retention(engine, now=now, horizons=Horizons.same(7 * DAY))

    assert deleted["gpu_samples"] == 6 + 4 and deleted["nic_samples"] == 3 + 2
    with engine.connect() as conn:
        assert old_day not in partitions.day_partitions(conn, "gpu_samples")
        assert conn.execute(text("SELECT to_regclass(:n)"), {"n": old_day}).scalar() is None
    assert where_rows_are(engine) == {partitions.day_partition("gpu_samples", today()): 4}


def test_migration_converts_both_ways_keeping_every_row(pg):
    server, engine = pg
    push(server.url, batch(samples=4, gpus=2, ts=today() - 3 * DAY + 7))
    push(server.url, batch(samples=4, gpus=2, ts=time.time() - 60))
    server.stop()
    config = migrate.alembic_config(engine)

    command.downgrade(config, "0004-1")  # to the revision before partitioning
    with engine.connect() as conn:
        assert not any(partitions.is_partitioned(conn, t) for t in partitions.TABLES)
        assert conn.execute(text("SELECT count(*) FROM gpu_samples")).scalar() == 16
        assert conn.execute(text("SELECT count(*) FROM nic_samples")).scalar() == 8

    migrate.upgrade(engine)
    rows = where_rows_are(engine)
    assert sum(rows.values()) == 16 and partitions.default_partition("gpu_samples") not in rows
    assert rows[partitions.day_partition("gpu_samples", today() - 3 * DAY)] == 8  # a day partition for the old rows
    assert sum(where_rows_are(engine, "nic_samples").values()) == 8


def test_sqlite_keeps_plain_tables(sqlite_url):
    engine = make_engine(sqlite_url)
    try:
        migrate.upgrade(engine)
        assert partitions.ensure_partitions(engine) == []
        with engine.connect() as conn:
            assert not partitions.is_partitioned(conn, "gpu_samples")
    finally:
        engine.dispose()
