"""The few statements whose spelling differs between SQLite and PostgreSQL."""

from __future__ import annotations

from sqlalchemy import Table
from sqlalchemy.dialects import postgresql, sqlite


def insert_ignore(dialect_name: str, table: Table):
    """INSERT ... ON CONFLICT DO NOTHING: a re-sent sample or a racing replica stores a row once."""
    if dialect_name == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing()
    if dialect_name == "sqlite":
        return sqlite.insert(table).on_conflict_do_nothing()
    raise NotImplementedError(f"unsupported database dialect {dialect_name!r}")


def upsert(dialect_name: str, table: Table, values: dict, *, key: str):
    """INSERT ... ON CONFLICT (key) DO UPDATE: set-or-replace a row by its key."""
    module = postgresql if dialect_name == "postgresql" else sqlite
    stmt = module.insert(table).values(**values)
    return stmt.on_conflict_do_update(index_elements=[key], set_={k: v for k, v in values.items() if k != key})
