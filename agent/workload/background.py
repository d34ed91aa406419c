"""One daemon thread that runs slow lookups (an API server list, an `scontrol` call) off the
sampling thread: a sample never waits on the network; what is not known yet stays null and
is filled in at a later sample."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable

log = logging.getLogger(__name__)


class Worker:
    """Runs `work(key)` for each requested key, one at a time, in order; a key requested again
    while still pending runs once. With background=False, `request` runs it inline (tests,
    one-shot use)."""

    def __init__(self, work: Callable[[Hashable], None], *, name: str, background: bool = True) -> None:
        self._work = work
        self._name = name
        self._background = background
        self._cond = threading.Condition()
        self._pending: dict[Hashable, None] = {}  # an ordered set
        self._busy = False
        self._closed = False
        self._thread: threading.Thread | None = None

    def request(self, key: Hashable) -> None:
        if not self._background:
            self._run(key)
            return
        with self._cond:
            if self._closed:
                return
            self._pending[key] = None
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def _run(self, key: Hashable) -> None:
        try:
            self._work(key)
        except Exception:  # the work counts its own failures; this is a bug, not a failure
            log.exception("%s: work on %r failed", self._name, key)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                key = next(iter(self._pending))
                del self._pending[key]
                self._busy = True
            try:
                self._run(key)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """True once nothing is pending or running (for tests and shutdown)."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending and not self._busy, timeout)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._pending.clear()
            self._cond.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
