"""Limits on the work a token (or a cluster) makes the collector do, not on its request count.

A request is a poor measure: a push of one sample of 8 GPUs and a push of 1,000 samples of 64
GPUs are both one request, and the second costs the writer 8,000 times as much. Two pure pieces,
with the clock injected, used by server/ingest/admission.py:

- WorkBudget: a bucket of work units (GPU-samples, node registrations) per key, refilled at
  `rate` per second up to `burst`. The cost of a batch is known only after it is decoded, so a
  request is let in while the key's balance is positive and its cost is then taken whole, which
  may leave the balance negative: a key that just pushed a batch larger than its balance waits
  until the debt is paid back, and that wait is its Retry-After.
- ConcurrencyCap: at most `limit` requests of one key in flight at a time.

Both are per process, like the request rate limit (ratelimit.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class WorkBudget:
    def __init__(self, *, rate: float, burst: float, clock: Callable[[], float] = time.monotonic, max_keys: int = 100_000):
        if rate <= 0 or burst <= 0:
            raise ValueError("rate and burst must be > 0")
        self.rate, self.burst, self._clock, self._max_keys = rate, burst, clock, max_keys
        self._balances: dict[str, tuple[float, float]] = {}  # key -> (balance, at)
        self._lock = threading.Lock()

    def wait(self, key: str) -> float:
        """0 if `key` may start a request now, else seconds until it may."""
        with self._lock:
            return _wait_for(self._refilled(key), self.rate)

    def take(self, key: str, cost: float) -> float:
        """Take `cost` if the balance is positive (it may go negative) and return 0; else take
        nothing and return the seconds until the balance is positive again."""
        with self._lock:
            balance = self._refilled(key)
            if balance <= 0:
                return _wait_for(balance, self.rate)
            if len(self._balances) >= self._max_keys and key not in self._balances:
                self._balances.clear()  # bounded memory; a full bucket for everyone is the safe side
            self._balances[key] = (balance - cost, self._clock())
            return 0.0

    def _refilled(self, key: str) -> float:
        now = self._clock()
        balance, at = self._balances.get(key, (self.burst, now))
        return min(self.burst, balance + (now - at) * self.rate)


def _wait_for(balance: float, rate: float) -> float:
    # Strictly positive once the debt is paid: a balance of exactly 0 lets nothing through.
    return 0.0 if balance > 0 else (-balance / rate) + 1e-3


class ConcurrencyCap:
    def __init__(self, limit: int):
        if limit < 1:
            raise ValueError("limit must be >= 1")
        self.limit = limit
        self._in_flight: dict[str, int] = {}
        self._lock = threading.Lock()

    def enter(self, key: str) -> bool:
        """Count one more request of `key` in flight; False (and nothing counted) at the limit."""
        with self._lock:
            n = self._in_flight.get(key, 0)
            if n >= self.limit:
                return False
            self._in_flight[key] = n + 1
            return True

    def leave(self, key: str) -> None:
        with self._lock:
            n = self._in_flight.get(key, 0) - 1
            if n > 0:
                self._in_flight[key] = n
            else:
                self._in_flight.pop(key, None)  # idle keys cost nothing

    def in_flight(self, key: str) -> int:
        with self._lock:
            return self._in_flight.get(key, 0)
