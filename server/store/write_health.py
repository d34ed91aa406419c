"""Whether this collector's writes are failing, for /readyz. A database that answers SELECT 1
but cannot store anything (disk full) left readiness at 200 while every push was refused.

Readiness is down from a write failing for the database's reason (disk full, unreachable)
until a write succeeds, but at most `hold_s`: a collector taken out of its Service gets no
pushes to succeed with, so after hold_s it reports ready again and the next push tells."""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass
class WriteHealth:
    hold_s: float
    _failure: str | None = None
    _failed_at: float = 0.0

    def failed(self, reason: str, *, now: float | None = None) -> None:
        self._failure, self._failed_at = reason, time.monotonic() if now is None else now

    def succeeded(self) -> None:
        self._failure = None

    def failing(self, *, now: float | None = None) -> str | None:
        """Why writes are failing, or None."""
        now = time.monotonic() if now is None else now
        if self._failure is None or now - self._failed_at > self.hold_s:
            return None
        return self._failure
