"""Bulk inserts on PostgreSQL through binary COPY, idempotent like INSERT ... ON CONFLICT DO NOTHING.

A group commit's rows go to the target table in one binary COPY, inside a savepoint. Almost
always nothing conflicts and that is all: COPY writes rows in batches (multi-insert), several
times faster than executemany (~1 ms per row statement) and ~1.6x faster than COPY into a
staging table followed by INSERT ... SELECT ... ON CONFLICT, which probes the primary key and
logs each row on its own (measured, docs/operations.md). A re-sent batch (an agent whose
acknowledgement was lost, a spool replayed) makes the COPY fail with a unique violation: the
savepoint is rolled back and the same rows take the slow, idempotent way, COPY into a staging
table (a temporary table per session, emptied at each commit) then INSERT ... SELECT ... ON
CONFLICT DO NOTHING, which also stores a key repeated within the group once. Either way the
rows are committed, or not, with the caller's transaction.

Binary COPY sends each value in its column's exact binary layout and the server checks only the
length: the types come from the table's SQLAlchemy columns (copy_types), never a list kept by
hand, and a column type without a mapping fails at import."""

from __future__ import annotations

import psycopg
from sqlalchemy import REAL, BigInteger, Boolean, Connection, Float, Integer, SmallInteger, String, Table
from sqlalchemy.exc import DBAPIError

# Most specific first: BigInteger and SmallInteger are Integers, REAL a Float, Text a String.
_COPY_TYPES = ((Boolean, "bool"), (BigInteger, "int8"), (SmallInteger, "int2"), (Integer, "int4"), (REAL, "float4"),
               (Float, "float8"), (String, "text"))

_SAVEPOINT = "laggard_copy"


def copy_type(column) -> str:
    """The PostgreSQL type a column's values are sent as in binary COPY."""
    for sql_type, name in _COPY_TYPES:
        if isinstance(column.type, sql_type):
            if name == "float8" and (column.type.precision or 53) <= 24:
                return "float4"  # Float(precision=24) is a REAL on PostgreSQL
            return name
    raise TypeError(f"binary COPY: no PostgreSQL type for {column.table.name}.{column.name} ({column.type!r})")


def copy_types(table: Table) -> list[str]:
    return [copy_type(c) for c in table.columns]


class CopyInsert:
    """Rows of one table, by position in the table's column order, through binary COPY."""

    def __init__(self, table: Table):
        self.types = copy_types(table)
        self.width = len(self.types)
        columns = ", ".join(f'"{c.name}"' for c in table.columns)
        staging = f"laggard_staging_{table.name}"
        self._copy = f'COPY "{table.name}" ({columns}) FROM STDIN (FORMAT BINARY)'
        self._copy_staging = f'COPY "{staging}" ({columns}) FROM STDIN (FORMAT BINARY)'
        # The target's column types without its constraints; created by the first conflict of a
        # session (and again after a rollback that took its creation away).
        self._create_staging = (f'CREATE TEMPORARY TABLE IF NOT EXISTS "{staging}" ON COMMIT DELETE ROWS '
                                f'AS SELECT {columns} FROM "{table.name}" WITH NO DATA')
        self._merge_staging = (f'INSERT INTO "{table.name}" ({columns}) SELECT {columns} FROM "{staging}" '
                               f'ON CONFLICT DO NOTHING')
        self._empty_staging = f'DELETE FROM "{staging}"'

    def execute_flat(self, conn: Connection, flat: list) -> None:
        """Insert rows laid end to end in one list, `width` values each; rows whose key is stored
        already, or repeated among them, are stored once."""
        self.execute(conn, list(zip(*[iter(flat)] * self.width)))  # one tuple per row, built in C

    def execute(self, conn: Connection, rows: list[tuple]) -> None:
        if not rows:
            return
        driver_connection = conn.connection.driver_connection
        with driver_connection.cursor() as cursor:
            try:
                self._insert(cursor, rows)
            except psycopg.Error as exc:
                raise _as_sqlalchemy_error(conn, exc, self._copy) from exc

    def _insert(self, cursor: psycopg.Cursor, rows: list[tuple]) -> None:
        cursor.execute(f"SAVEPOINT {_SAVEPOINT}")
        try:
            self._copy_rows(cursor, self._copy, rows)
        except psycopg.errors.UniqueViolation:
            cursor.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
            self._insert_skipping_stored(cursor, rows)
        cursor.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}")

    def _insert_skipping_stored(self, cursor: psycopg.Cursor, rows: list[tuple]) -> None:
        cursor.execute(self._create_staging)
        # Emptied at commit; emptied here too, for a second use within one transaction.
        cursor.execute(self._empty_staging)
        self._copy_rows(cursor, self._copy_staging, rows)
        cursor.execute(self._merge_staging)

    def _copy_rows(self, cursor: psycopg.Cursor, sql: str, rows: list[tuple]) -> None:
        with cursor.copy(sql) as copy:
            copy.set_types(self.types)
            for row in rows:
                copy.write_row(row)


def _as_sqlalchemy_error(conn: Connection, exc: psycopg.Error, statement: str) -> DBAPIError:
    """A driver error as SQLAlchemy raises it for its own statements, so that the ingest path
    tells a database that went away (503: the agent retries) from a bad batch as before; a lost
    connection is invalidated, as SQLAlchemy would, so that nothing tries to roll back on it."""
    lost = conn.dialect.is_disconnect(exc, conn.connection.dbapi_connection, None)
    if lost:
        conn.invalidate(exc)
    return DBAPIError.instance(statement, None, exc, psycopg.Error, connection_invalidated=lost)
