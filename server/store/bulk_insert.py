"""Bulk row inserts on the ingest hot path: positional tuples, no per-row dicts.

SQLite gets multi-row VALUES statements: executemany would step (and release and re-take
the GIL) once per row, and with the event loop thread also wanting the GIL each hand-back can
wait a whole switch interval; one statement per chunk of rows steps once. PostgreSQL gets binary
COPY, idempotent all the same (server/store/pg_copy.py): 3-4x the rows per second of executemany."""

from __future__ import annotations

from itertools import chain

from sqlalchemy import Connection, Table

from server.store.pg_copy import CopyInsert

# Chunks of 256 rows, then halves for the remainder: few statements per group commit, and
# few distinct statements (9 sizes) for the driver's statement cache. 256 rows × 43 columns
# stays far below SQLite's 32766 variable limit.
SQLITE_MAX_ROWS_PER_STATEMENT = 256


class BulkInsert:
    def __init__(self, dialect_name: str, table: Table):
        self.dialect_name = dialect_name
        columns = ", ".join(f'"{c.name}"' for c in table.columns)
        self._head = f'INSERT INTO "{table.name}" ({columns}) VALUES '
        self._tail = " ON CONFLICT DO NOTHING"
        self._row = "(" + ", ".join("?" for _ in table.columns) + ")"
        self._multi: dict[int, str] = {}
        self.width = len(table.columns)
        self._copy = CopyInsert(table) if dialect_name == "postgresql" else None

    def execute(self, conn: Connection, rows: list[tuple]) -> None:
        """Insert rows, skipping any whose primary key is already stored (idempotent re-sends)."""
        if not rows:
            return
        if self._copy is not None:
            self._copy.execute(conn, rows)
            return
        start, size = 0, SQLITE_MAX_ROWS_PER_STATEMENT
        while start < len(rows):
            while size > len(rows) - start:
                size //= 2
            chunk = rows[start : start + size]
            conn.exec_driver_sql(self._statement(size), tuple(chain.from_iterable(chunk)))
            start += size

    def execute_flat(self, conn: Connection, flat: list) -> None:
        """execute() for rows laid end to end in one list, `width` values each."""
        if not flat:
            return
        width = self.width
        if self._copy is not None:
            self._copy.execute_flat(conn, flat)
            return
        rows, start, size = len(flat) // width, 0, SQLITE_MAX_ROWS_PER_STATEMENT
        while start < rows:
            while size > rows - start:
                size //= 2
            conn.exec_driver_sql(self._statement(size), tuple(flat[start * width : (start + size) * width]))
            start += size

    def _statement(self, n: int) -> str:
        sql = self._multi.get(n)
        if sql is None:
            sql = self._multi[n] = self._head + ", ".join([self._row] * n) + self._tail
        return sql
