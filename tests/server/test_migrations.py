"""The Alembic migrations produce exactly the models' schema, on both databases."""

from __future__ import annotations

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from server.store import migrate
from server.store.engine import make_engine
from server.store.schema import Base


def _diff(engine):
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        return compare_metadata(context, Base.metadata)


def test_upgrade_gives_the_models_schema(database_url):
    engine = make_engine(database_url)
    try:
        migrate.upgrade(engine)
        assert _diff(engine) == []
        assert migrate.current_revision(engine) is not None
        assert set(inspect(engine).get_table_names()) >= set(Base.metadata.tables)
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
