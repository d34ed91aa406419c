"""Alembic environment: the engine comes from the caller (server.store.migrate)."""

from alembic import context
from sqlalchemy import create_engine

from server.store.schema import Base

config = context.config
target_metadata = Base.metadata


def run_migrations_online() -> None:
    engine = config.attributes.get("engine")
    if engine is None:
        # Plain `alembic` command line: fall back to the sqlalchemy.url option.
        engine = create_engine(config.get_main_option("sqlalchemy.url"))
    with engine.begin() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            # SQLite cannot ALTER most things: batch mode rebuilds tables instead.
            render_as_batch=connection.dialect.name == "sqlite",
            compare_type=True,
        )
        context.run_migrations()


run_migrations_online()
