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
