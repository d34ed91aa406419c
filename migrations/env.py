"""Alembic environment: the engine comes from the caller (server.store.migrate)."""

import zlib

from alembic import context
from sqlalchemy import create_engine, text

from server.store.partitions import is_partition_name
from server.store.schema import Base

config = context.config
target_metadata = Base.metadata
_MIGRATION_LOCK_KEY = zlib.crc32(b"laggard-migrate")


def run_migrations_online() -> None:
    engine = config.attributes.get("engine")
    if engine is None:
        # Plain `alembic` command line: fall back to the sqlalchemy.url option.
        engine = create_engine(config.get_main_option("sqlalchemy.url"))
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            # Replicas starting together migrate one after the other; the later ones find the
            # schema at head. Held until this transaction ends.
            connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK_KEY})
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            # SQLite cannot ALTER most things: batch mode rebuilds tables instead.
            render_as_batch=connection.dialect.name == "sqlite",
            compare_type=True,
            # Day partitions of the sample tables are created at run time, not by models.
            include_name=lambda name, type_, _parent: not (type_ == "table" and is_partition_name(name)),
        )
        context.run_migrations()


run_migrations_online()
