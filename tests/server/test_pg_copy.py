"""Ingest through binary COPY on PostgreSQL (server/store/pg_copy.py): what goes in comes back as
SQLite stores it, a repeated (GPU, ts) is stored once, and a COPY that fails takes its whole
transaction with it. On the real PostgreSQL (and SQLite beside it, for the comparison)."""

from __future__ import annotations

import time

import psycopg
import pytest
from pydantic import TypeAdapter
from sqlalchemy import func, insert, select, text

from server import protocol
from server.ingest.decode import decode_rows
from server.store import migrate, pg_copy, samples, schema, workloads
from server.store.bulk_insert import BulkInsert
from server.store.engine import database_unavailable, make_engine
from server.store.samples import SampleWriter
from server.store.writer import IngestWriter
from tests.server.payloads import batch, encode

GPU_SAMPLES = schema.GpuSample.__table__
NIC_SAMPLES = schema.NicSample.__table__
COPIED_TABLES = (GPU_SAMPLES, NIC_SAMPLES, schema.GpuWorkload.__table__, samples._XID_KEY)
INT4_MAX = 2**31 - 1
# What format_type() names each binary COPY type (a varchar(n) column takes text's layout).
_DATABASE_TYPE = {"bool": "boolean", "int2": "smallint", "int4": "integer", "int8": "bigint", "float4": "real",
                  "float8": "double precision", "text": ("text", "character varying")}


@pytest.fixture
def pg_engine(postgres_url):
    engine = make_engine(postgres_url)
    migrate.upgrade(engine)
    yield engine
    engine.dispose()


def _engine_for(url: str):
    engine = make_engine(url)
    migrate.upgrade(engine)
    return engine


def test_copy_types_are_the_database_column_types(pg_engine):
    """Binary COPY checks only each value's length: a model type that drifted from the migrated
    column would store garbage or fail every push."""
    with pg_engine.connect() as conn:
        for table in COPIED_TABLES:
            stored = dict(conn.execute(text(
                "SELECT attname, format_type(atttypid, NULL) FROM pg_attribute "
                "WHERE attrelid = CAST(:t AS regclass) AND attnum > 0 AND NOT attisdropped"), {"t": table.name}).all())
            for column, copy_type in zip(table.columns, pg_copy.copy_types(table)):
                expected = _DATABASE_TYPE[copy_type]
                assert stored[column.name] in (expected if isinstance(expected, tuple) else (expected,)), (table.name, column.name)


def test_every_int4_column_is_bounded_below_int4_by_the_protocol():
    """A Python int beyond int4 is written by binary COPY with its high bits cut off (psycopg
    packs it, the server sees 4 bytes): validation must keep every int4 column's values in range."""
    wire = {"gpu_samples": protocol.Gpu, "nic_samples": protocol.Nic, "gpu_workloads": protocol.Workload, "xid_events": protocol.Xid}
    for table in COPIED_TABLES:
        bounds = _maximums(TypeAdapter(wire[table.name]).json_schema())
        for column, copy_type in zip(table.columns, pg_copy.copy_types(table)):
            if copy_type in ("int2", "int4") and column.name in bounds:
                assert bounds[column.name] <= INT4_MAX, (table.name, column.name, bounds[column.name])


def _maximums(json_schema: dict) -> dict[str, float]:
    out = {}
    for name, prop in json_schema.get("properties", {}).items():
        found = [p["maximum"] for p in [prop, *prop.get("anyOf", [])] if "maximum" in p]
        out[name] = max(found) if found else float("inf")
    return out


def test_a_column_type_without_a_copy_type_fails_at_once():
    from sqlalchemy import Column, MetaData, Numeric, Table

    with pytest.raises(TypeError, match="t.n"):
        pg_copy.copy_types(Table("t", MetaData(), Column("n", Numeric)))


# --- rows round-trip, as SQLite stores them ----------------------------------------------------

TS = time.time() - 3600


def _gpu_rows() -> list[tuple]:
    """Rows covering every gpu_samples column type: NULL in every nullable column, a float column
    given an int (JSON 700 is an int), the largest bigint the protocol allows, both booleans."""
    width = len(GPU_SAMPLES.columns)
    everything = []
    for column in GPU_SAMPLES.columns[2:]:
        copy_type = pg_copy.copy_type(column)
        everything.append({"bool": True, "int4": 100_000, "int8": 2**63 - 1, "float8": 0.1 + 0.2}[copy_type])
    nulls = [False] + [None] * (width - 3)
    ints_in_floats = [v if pg_copy.copy_type(c) != "float8" else 700 for c, v in zip(GPU_SAMPLES.columns[2:], everything)]
    return [(1, TS, *everything), (1, TS + 1, *nulls), (2, TS, *ints_in_floats), (2, 1e9, *nulls)]  # 1e9: the DEFAULT partition


def _nic_rows() -> list[tuple]:
    return [(1, TS, "ACTIVE", 400.0, *[2**62] * 7), (1, TS + 1, None, None, *[None] * 7), (1, TS + 2, "Ünïcode ✓", 25, *[0] * 7)]


def _workload_rows() -> list[tuple]:
    return [(1, TS, "pod", "llm-a", "ns", "pod-0", "uid", "c", "cid", None, None, "alice", "python", INT4_MAX, 3, 1),
            (2, TS, *workloads.UNKNOWN)]


def _inventory(engine) -> None:
    with engine.begin() as conn:
        conn.execute(insert(schema.Node), [{"id": 1, "cluster": "c", "name": "n1", "labels": {}, "first_seen": 0.0, "last_seen": 0.0}])
        conn.execute(insert(schema.Gpu), [{"id": i, "uuid": f"GPU-{i}", "node_id": 1, "index": i, "first_seen": 0.0} for i in (1, 2)])
        conn.execute(insert(schema.Nic), [{"id": 1, "node_id": 1, "device": "mlx5_0", "port": 1, "first_seen": 0.0}])


def _store_and_read(engine) -> dict[str, list[tuple]]:
    _inventory(engine)
    rows = {GPU_SAMPLES: _gpu_rows(), NIC_SAMPLES: _nic_rows(), schema.GpuWorkload.__table__: _workload_rows()}
    with engine.begin() as conn:
        for table, table_rows in rows.items():
            BulkInsert(engine.dialect.name, table).execute_flat(conn, [v for row in table_rows for v in row])
        BulkInsert(engine.dialect.name, samples._XID_KEY).execute(conn, [(1, 79, TS), (2, 48, TS + 0.5)])
    read = {}
    with engine.connect() as conn:
        for table in (*rows, schema.XidEvent.__table__):
            key = [c for c in table.columns if c.name != "id"]
            read[table.name] = [tuple(r) for r in conn.execute(select(*key).order_by(*key[:3])).all()]
    return read


def test_every_column_type_and_null_round_trips_as_sqlite_stores_it(postgres_url, sqlite_url):
    on_postgres, on_sqlite = _engine_for(postgres_url), _engine_for(sqlite_url)
    try:
        stored_pg, stored_sqlite = _store_and_read(on_postgres), _store_and_read(on_sqlite)
    finally:
        on_postgres.dispose()
        on_sqlite.dispose()
    assert stored_pg == stored_sqlite
    # ... and as sent (a bool stays a bool, the int given to a float column comes back a float).
    assert stored_pg["gpu_samples"] == sorted(_gpu_rows(), key=lambda r: (r[0], r[1]))
    for got_sqlite, got_pg in zip(stored_sqlite["gpu_samples"], stored_pg["gpu_samples"]):
        assert [type(v) for v in got_pg] == [type(v) for v in got_sqlite]
    assert stored_pg["nic_samples"] == _nic_rows()
    assert len(stored_pg["xid_events"]) == 2 and len(stored_pg["gpu_workloads"]) == 2


# --- idempotence --------------------------------------------------------------------------------


def _count(engine, table=GPU_SAMPLES) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(table)).scalar_one()


def _copy(engine, rows: list[tuple], table=GPU_SAMPLES) -> None:
    with engine.begin() as conn:
        BulkInsert("postgresql", table).execute_flat(conn, [v for row in rows for v in row])


def test_a_row_sent_again_is_stored_once(pg_engine):
    _inventory(pg_engine)
    first = _gpu_rows()
    _copy(pg_engine, first)
    # Again, with new rows around it: the new ones are stored, the repeated ones once.
    _copy(pg_engine, [(1, TS + 5, *first[0][2:]), *first, (2, TS + 5, *first[1][2:])])
    _copy(pg_engine, first)
    assert _count(pg_engine) == len(first) + 2
    with pg_engine.connect() as conn:  # the first copy of a row is the one kept
        assert conn.execute(select(GPU_SAMPLES.c.temp_c).where(GPU_SAMPLES.c.gpu_id == 1, GPU_SAMPLES.c.ts == TS)).scalar_one() == 0.1 + 0.2


def test_a_key_repeated_within_one_group_is_stored_once(pg_engine):
    _inventory(pg_engine)
    row = _gpu_rows()[0]
    changed = (*row[:3], 99.0, *row[4:])
    _copy(pg_engine, [row, changed, (2, TS, *row[2:]), row])
    assert _count(pg_engine) == 2
    _copy(pg_engine, [(1, TS + 9, *row[2:])] * 3, table=GPU_SAMPLES)
    assert _count(pg_engine) == 3


def test_the_staging_table_is_empty_again_after_a_conflict(pg_engine):
    """The idempotent way leaves nothing behind for the next group of the same session."""
    _inventory(pg_engine)
    row = _gpu_rows()[0]
    with pg_engine.connect() as conn:
        for ts in (TS, TS, TS + 1, TS + 1):  # each group conflicts with the one before
            with conn.begin():
                BulkInsert("postgresql", GPU_SAMPLES).execute_flat(conn, [1, ts, *row[2:]])
        with conn.begin():
            assert conn.exec_driver_sql("SELECT count(*) FROM laggard_staging_gpu_samples").scalar_one() == 0
    assert _count(pg_engine) == 2


def test_a_batch_pushed_twice_through_the_writer_is_stored_once(pg_engine):
    writer = IngestWriter(pg_engine, threads=2)
    writer.start()
    try:
        body = encode(batch(samples=3, gpus=4), gzipped=True)[0]
        # Twice at once (one group, or two concurrent transactions), then once more later.
        futures = [writer.submit(_decoder(body)) for _ in range(2)]
        assert [f.result(30) for f in futures] == [3, 3]
        assert writer.submit(_decoder(body)).result(30) == 3
    finally:
        writer.stop()
    assert _count(pg_engine) == 12
    assert _count(pg_engine, NIC_SAMPLES) == 3


def _decoder(body: bytes):
    return lambda: decode_rows(body, gzipped=True, limit=1 << 24, now=time.time(), max_future_skew_s=300)


# --- failure: nothing stored, nothing acknowledged ---------------------------------------------


def test_a_failed_copy_rolls_back_the_group_and_acknowledges_nothing(pg_engine, monkeypatch):
    """The port rows' COPY fails (a column sent as the wrong type) after the GPU rows' COPY went
    in: the transaction takes both back, and no push of the group is answered with success."""
    writer = IngestWriter(pg_engine, threads=1)
    broken = SampleWriter("postgresql")
    broken.nic_insert._copy.types = ["int4" if t == "int8" else t for t in broken.nic_insert._copy.types]
    monkeypatch.setattr(writer, "_rows", broken)
    writer.start()
    try:
        bodies = [encode(batch(node=f"n{i}", samples=2, gpus=2), gzipped=True)[0] for i in range(3)]
        futures = [writer.submit(_decoder(body)) for body in bodies]
        for future in futures:
            with pytest.raises(Exception, match="binary|format|insufficient"):
                future.result(30)
    finally:
        writer.stop()
    assert writer.committed_samples == 0
    assert _count(pg_engine) == 0
    assert _count(pg_engine, NIC_SAMPLES) == 0
    assert _count(pg_engine, schema.IngestLog.__table__) == 0


def test_a_database_gone_during_copy_reads_as_unavailable(pg_engine):
    """Driver errors come out as SQLAlchemy's, so the ingest path answers 503 (retry) as it
    does for any other statement when the database goes away."""
    _inventory(pg_engine)
    with pg_engine.connect() as conn:
        pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        with psycopg.connect(pg_engine.url.render_as_string(hide_password=False).replace("+psycopg", ""), autocommit=True) as other:
            other.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(Exception) as failed:
            BulkInsert("postgresql", GPU_SAMPLES).execute_flat(conn, list(_gpu_rows()[0]))
    assert database_unavailable(failed.value), repr(failed.value)
