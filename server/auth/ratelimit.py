"""A token bucket per API token: `rate` requests per second on average, bursts up to `burst`.
Per process: with N workers or replicas behind a balancer a token may reach N times the rate
(docs/security.md), which still stops a runaway client from starving the others."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable


class RateLimiter:
    def __init__(self, *, rate: float, burst: float, clock: Callable[[], float] = time.monotonic, max_keys: int = 100_000):
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be > 0 and burst >= 1")
        self.rate, self.burst, self._clock, self._max_keys = rate, burst, clock, max_keys
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, at)
        self._lock = threading.Lock()

    def take(self, key: str) -> float:
        """0 if the request may go ahead (and counts it), else seconds until it could."""
        now = self._clock()
        with self._lock:
            tokens, at = self._buckets.get(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - at) * self.rate)
            if tokens >= 1:
                if len(self._buckets) >= self._max_keys and key not in self._buckets:
                    self._buckets.clear()  # bounded memory; a full bucket for everyone is the safe side
                self._buckets[key] = (tokens - 1, now)
                return 0.0
            self._buckets[key] = (tokens, now)
            return (1 - tokens) / self.rate


def retry_after_header(wait_s: float) -> str:
    return str(max(1, math.ceil(wait_s)))
