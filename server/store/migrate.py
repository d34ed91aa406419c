"""Schema upgrades through Alembic, driven from code so that `laggard server` and
`laggard migrate` share one path and need no alembic.ini."""

from __future__ import annotations

from importlib.resources import files

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine


def alembic_config(engine: Engine) -> Config:
    config = Config()
    config.set_main_option("script_location", str(files("laggard_migrations")))
    config.attributes["engine"] = engine
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    command.upgrade(alembic_config(engine), revision)


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()
