"""Exactly one detector per database: whichever process holds the lock runs it, and another
takes over when that process dies (the lock dies with it).

SQLite: an exclusive flock on a side file. PostgreSQL: a session advisory lock held on a
dedicated connection."""

from __future__ import annotations

import fcntl
import os
import zlib

from sqlalchemy import Engine, text

_ADVISORY_KEY = zlib.crc32(b"laggard-detector")


class LeaderLock:
    def __init__(self, engine: Engine):
        self.engine = engine
        self._fd: int | None = None
        self._conn = None

    def try_acquire(self) -> bool:
        if self.held:
            return True
        if self.engine.dialect.name == "sqlite":
            return self._flock()
        return self._advisory()

    @property
    def held(self) -> bool:
        return self._fd is not None or self._conn is not None

    def still_held(self) -> bool:
        """False when the database connection holding the advisory lock was lost."""
        if self._conn is None:
            return self._fd is not None
        try:
            self._conn.execute(text("SELECT 1"))
            return True
        except Exception:
            self.release()
            return False

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:
                pass
            self._conn = None

    def _flock(self) -> bool:
        database = self.engine.url.database
        if not database or database == ":memory:":
            self._fd = os.open(os.devnull, os.O_RDONLY)
            return True
        fd = os.open(f"{database}.detector-lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def _advisory(self) -> bool:
        conn = self.engine.connect()
        got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": _ADVISORY_KEY}).scalar()
        conn.commit()
        if got:
            self._conn = conn
            return True
        conn.close()
        return False
