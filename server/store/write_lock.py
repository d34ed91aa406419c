"""Serialising SQLite writers across worker processes.

SQLite allows one writer at a time; a second process that finds the database locked backs off
in sleeps of up to 100 ms, which wastes most of a busy collector's time. A blocking flock on a
side file hands the write turn over as soon as it is released, and a writer that finds it
taken can do other work first (acquire(blocking=False))."""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Iterator

from sqlalchemy import Engine


class WriteTurn:
    def __init__(self, path: str | None):
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600) if path else None
        # The flock belongs to the open file, which this process's threads share.
        self._threads = threading.Lock()

    @classmethod
    def for_engine(cls, engine: Engine) -> "WriteTurn":
        database = engine.url.database if engine.dialect.name == "sqlite" else None
        if not database or database == ":memory:":
            return cls(None)
        return cls(f"{database}.write-lock")

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        self.acquire()
        try:
            yield
        finally:
            self.release()

    def acquire(self, blocking: bool = True) -> bool:
        if self._fd is None:  # PostgreSQL, or SQLite in memory: the database copes alone
            return True
        if not self._threads.acquire(blocking):
            return False
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX if blocking else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._threads.release()
            return False
        except BaseException:
            self._threads.release()
            raise
        return True

    def release(self) -> None:
        if self._fd is None:
            return
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._threads.release()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
