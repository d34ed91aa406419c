"""Rows as the database driver's own tuples, past SQLAlchemy's Row objects: at 100,000 GPUs
building those cost more than the queries that read the fleet's inventory and latest samples
(server/metrics, server/hints). The SQL is written in the driver's own parameter style."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection


def driver_rows(conn: Connection, sql: str, params: Any) -> list[tuple]:
    cursor = conn.connection.dbapi_connection.cursor()
    try:
        cursor.execute(sql, params)
        return cursor.fetchall()
    finally:
        cursor.close()
