"""Engine construction. SQLite gets WAL and synchronous=FULL so that a commit (and so an
acknowledgement) survives a crash and a power cut."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

SQLITE_MMAP_MB = 256


def make_engine(database_url: str, *, sqlite_mmap_mb: int = SQLITE_MMAP_MB) -> Engine:
    if database_url.startswith("sqlite"):
        # The ingest path binds raw tuples with Python bools in them (`lost`, ...). SQLite
        # stores a bool as 0/1 either way, but with no adapter registered sqlite3 searches for
        # one (registry, __adapt__, __conform__) on every bool: ~0.5 µs each, 160 per body.
        sqlite3.register_adapter(bool, int)
        engine = create_engine(database_url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", lambda dbapi_connection, _record: _sqlite_pragmas(dbapi_connection, sqlite_mmap_mb))
        return engine
    # A database that is down must mean a quick 503 (the agents spool and retry), not requests
    # hanging on a connect or on a pool slot; keepalives notice a peer that vanished.
    return create_engine(database_url, pool_size=8, max_overflow=8, pool_pre_ping=True, pool_timeout=10,
                         connect_args=_postgres_connect_args(database_url))


@contextmanager
def read_snapshot(engine: Engine) -> Iterator[Connection]:
    """A connection whose reads all see one committed state of the database, as of its first.
    By default each statement sees the latest commit: PostgreSQL's READ COMMITTED, and pysqlite
    opens no transaction for a SELECT. A reader that follows the ingest log and then reads the
    rows behind it would see a batch committed in between by halves (its GPU rows in one
    statement, missing from the next)."""
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            conn.exec_driver_sql("BEGIN")  # WAL: the snapshot is taken at the first read and held
        else:
            conn.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
        yield conn


# libpq connection parameters; any of them given in the URL's query wins.
_POSTGRES_DEFAULTS = {"connect_timeout": 5, "keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3}


def _postgres_connect_args(database_url: str) -> dict[str, int]:
    given = make_url(database_url).query
    return {k: v for k, v in _POSTGRES_DEFAULTS.items() if k not in given}


def _sqlite_pragmas(dbapi_connection, mmap_mb: int) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=30000")
    # With several worker processes each one's page cache is dropped whenever another has
    # written; mapped pages are re-read without a system call and a copy each. Mapped pages
    # count in the process's RSS (settings.sqlite_mmap_mb).
    cursor.execute(f"PRAGMA mmap_size={int(mmap_mb) * 1024 * 1024}")
    cursor.close()


# SQLite's SQLITE_FULL ("database or disk is full") and PostgreSQL's SQLSTATE disk_full.
_PG_DISK_FULL = "53100"


def disk_full(exc: BaseException) -> bool:
    """Whether a failed write found no space left for the database: the agent should send the
    batch again once an operator has freed some, and the collector is not ready meanwhile."""
    cause = getattr(exc, "orig", None) or exc
    if isinstance(cause, sqlite3.Error):
        return (getattr(cause, "sqlite_errorcode", 0) & 0xFF) == sqlite3.SQLITE_FULL
    return getattr(cause, "sqlstate", None) == _PG_DISK_FULL


def database_unavailable(exc: BaseException) -> bool:
    """Whether a failed write is the database's state (down, locked, pool exhausted) rather
    than the batch's fault: the agent should send it again later."""
    if isinstance(exc, (OperationalError, PoolTimeoutError)):
        return True
    return isinstance(exc, DBAPIError) and exc.connection_invalidated
