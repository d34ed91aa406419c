"""Rows as the database driver's own tuples, past SQLAlchemy's Row objects: at 100,000 GPUs
building those cost more than the queries that read the fleet's inventory and latest samples
(server/metrics, server/hints). The SQL is written in the driver's own parameter style."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection
from sqlalchemy.sql import Select


def driver_rows(conn: Connection, sql: str, params: Any) -> list[tuple]:
    cursor = conn.connection.dbapi_connection.cursor()
    try:
        cursor.execute(sql, params)
        return cursor.fetchall()
    finally:
        cursor.close()


def select_rows(conn: Connection, stmt: Select) -> list[tuple]:
    """driver_rows() of a SQLAlchemy select, compiled for the connection's dialect (expanding IN
    lists into plain parameters). No result processing: values as the driver gives them (SQLite's
    booleans as 0/1)."""
    compiled = stmt.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
    params = compiled.params
    if compiled.positional:
        params = tuple(params[name] for name in compiled.positiontup)
    return driver_rows(conn, str(compiled), params)
