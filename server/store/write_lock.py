"""Serialising SQLite writers across worker processes.

SQLite allows one writer at a time; a second process that finds the database locked backs off
in sleeps of up to 100 ms, which wastes most of a busy collector's time. A blocking flock on a
side file hands the write turn over as soon as it is released, and while one process waits its
queue fills, so its next group commit is larger."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator

from sqlalchemy import Engine


class WriteTurn:
    def __init__(self, path: str | None):
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600) if path else None

    @classmethod
    def for_engine(cls, engine: Engine) -> "WriteTurn":
        database = engine.url.database if engine.dialect.name == "sqlite" else None
        if not database or database == ":memory:":
            return cls(None)
        return cls(f"{database}.write-lock")

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        if self._fd is None:
            yield
            return
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
