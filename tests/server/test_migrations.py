"""The Alembic migrations produce exactly the models' schema, on both databases.

On PostgreSQL the sample tables are partitioned by day (migration 0004): the parents carry the
models' columns, keys and foreign keys and are compared like any table; the partitions
themselves (gpu_samples_p20261202, ..._default) are storage, not schema, and are left out."""

from __future__ import annotations

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from server.store import migrate, partitions
from server.store.engine import make_engine
from server.store.schema import Base


def _diff(engine):
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True, "include_name": _not_a_partition})
        return compare_metadata(context, Base.metadata)


def _not_a_partition(name, type_, _parent) -> bool:
    return not (type_ == "table" and partitions.is_partition_name(name))


def test_upgrade_gives_the_models_schema(database_url):
    engine = make_engine(database_url)
    try:
        migrate.upgrade(engine)
        assert _diff(engine) == []
        assert migrate.current_revision(engine) is not None
        assert set(inspect(engine).get_table_names()) >= set(Base.metadata.tables)
        if engine.dialect.name == "postgresql":
            with engine.connect() as conn:
                assert all(partitions.is_partitioned(conn, t) for t in partitions.TABLES)
    finally:
        engine.dispose()


def test_downgrade_to_base_and_up_again(database_url):
    engine = make_engine(database_url)
    try:
        migrate.upgrade(engine)
        command.downgrade(migrate.alembic_config(engine), "base")
        assert set(inspect(engine).get_table_names()) - {"alembic_version"} == set()
        migrate.upgrade(engine)
        assert _diff(engine) == []
    finally:
        engine.dispose()


def test_an_empty_database_differs_from_the_models(sqlite_url):
    # Guards the check above: compare_metadata must see a missing schema.
    engine = make_engine(sqlite_url)
    try:
        assert _diff(engine) != []
    finally:
        engine.dispose()


def test_0009_adds_the_dcgm_readings_as_null_to_rows_already_stored(database_url):
    """Issue #16: upgrading a database that holds samples keeps them, with the new readings null;
    on PostgreSQL the day partition that already exists gets the columns too and takes new rows."""
    import time

    from sqlalchemy import text

    new = ["energy_mj_total", "util_enc_pct", "util_dec_pct", "mem_reserved_bytes", "remapped_rows_correctable_total",
           "remapped_rows_uncorrectable_total", "remapped_rows_failure", "gr_engine_active_pct", "dram_active_pct"]
    engine = make_engine(database_url)
    try:
        migrate.upgrade(engine, "0008")
        now = time.time()
        partitions.ensure_partitions(engine, now=now)
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO nodes (id, cluster, name, labels, first_seen, last_seen) VALUES (1, 'c', 'n', '{}', 1, 1)"))
            conn.execute(text('INSERT INTO gpus (id, uuid, node_id, "index", first_seen) VALUES (1, \'GPU-1\', 1, 0, 1)'))
            conn.execute(text("INSERT INTO gpu_samples (gpu_id, ts, lost, temp_c, tensor_active_pct) VALUES (1, :ts, false, 60.5, 50.0)"),
                         {"ts": now})
        migrate.upgrade(engine, "0009")
        assert migrate.current_revision(engine) == "0009"
        cols = ", ".join(new)
        with engine.begin() as conn:
            old = conn.execute(text(f"SELECT temp_c, tensor_active_pct, {cols} FROM gpu_samples")).one()
            assert tuple(old) == (60.5, 50.0, *[None] * len(new))
            if engine.dialect.name == "postgresql":
                (holder,) = conn.execute(text("SELECT tableoid::regclass::text FROM gpu_samples")).one()
                assert holder.startswith("gpu_samples_p"), holder  # a day partition made before the upgrade
            conn.execute(text(f"INSERT INTO gpu_samples (gpu_id, ts, lost, {cols}) VALUES (1, :ts, false, 7, 1, 2, 3, 4, 5, true, 6, 8)"),
                         {"ts": now + 1})
            got = conn.execute(text(f"SELECT {cols} FROM gpu_samples WHERE ts = :ts"), {"ts": now + 1}).one()
        assert tuple(got) == (7, 1.0, 2.0, 3, 4, 5, True, 6.0, 8.0)
    finally:
        engine.dispose()


def test_0010_adds_gpu_workloads_beside_stored_samples(database_url):
    """Issue #15: upgrading a database that holds GPUs and samples adds the empty change table,
    which takes rows keyed by GPU and ts; downgrading drops it and leaves the samples."""
    from sqlalchemy import text

    engine = make_engine(database_url)
    try:
        migrate.upgrade(engine, "0009")
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO nodes (id, cluster, name, labels, first_seen, last_seen) VALUES (1, 'c', 'n', '{}', 1, 1)"))
            conn.execute(text('INSERT INTO gpus (id, uuid, node_id, "index", first_seen) VALUES (1, \'GPU-1\', 1, 0, 1)'))
        assert "gpu_workloads" not in inspect(engine).get_table_names()
        migrate.upgrade(engine)
        assert _diff(engine) == []
        with engine.begin() as conn:
            assert conn.execute(text("SELECT count(*) FROM gpu_workloads")).scalar_one() == 0
            conn.execute(text('INSERT INTO gpu_workloads (gpu_id, ts, kind, job, "user", pid) VALUES (1, 5.0, \'slurm\', \'llm-b\', \'alice\', 7)'))
            assert conn.execute(text('SELECT kind, job, "user", pid FROM gpu_workloads')).one() == ("slurm", "llm-b", "alice", 7)
        command.downgrade(migrate.alembic_config(engine), "0009")
        assert "gpu_workloads" not in inspect(engine).get_table_names()
        with engine.connect() as conn:
            assert conn.execute(text("SELECT uuid FROM gpus")).scalar_one() == "GPU-1"
    finally:
        engine.dispose()
