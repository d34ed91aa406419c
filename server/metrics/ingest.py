"""Ingest request metrics: an ASGI middleware times POST /api/v1/samples and notes its status.

It sits in front of the router and costs two perf_counter() calls, a bisect and an uncontended
lock per ingest request (bench/ingest.py measured no change, docs/observability.md); every other
path passes straight through. Counts accumulate in the process and are added to the shared
database counters every flush_interval_s (server/metrics/maintainer.py), so the latency
histogram and the reject counts cover every worker and replica whichever one is scraped.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left

LATENCY_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, float("inf"))
# Rejections the ingest route answers (server/ingest/decode.py, server/ingest/router.py); exposed at 0
# from the start so that rate() has a series before the first one happens.
KNOWN_REJECT_CODES: tuple[int, ...] = (400, 401, 403, 408, 409, 413, 415, 422, 429, 500, 503, 507)

DURATION = "laggard_ingest_request_duration_seconds"
REJECTED = "laggard_ingest_rejected_requests_total"
INGEST_PATH = "/api/v1/samples"


class IngestRecorder:
    """This process's ingest request counts since the last drain()."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buckets = [0] * len(LATENCY_BUCKETS)
        self._sum = 0.0
        self._codes: dict[int, int] = {}

    def observe(self, status: int, seconds: float) -> None:
        with self._lock:
            self._buckets[bisect_left(LATENCY_BUCKETS, seconds)] += 1
            self._sum += seconds
            if status >= 300:
                self._codes[status] = self._codes.get(status, 0) + 1

    def drain(self) -> list[tuple[str, dict[str, str], float]]:
        """The counts since the last drain, as counter deltas (cumulative buckets), and reset."""
        with self._lock:
            buckets, total, codes = self._buckets, self._sum, self._codes
            self._buckets, self._sum, self._codes = [0] * len(LATENCY_BUCKETS), 0.0, {}
        count = sum(buckets)
        if not count:
            return []
        deltas: list[tuple[str, dict[str, str], float]] = []
        cumulative = 0
        for le, n in zip(LATENCY_BUCKETS, buckets):
            cumulative += n
            deltas.append((f"{DURATION}_bucket", {"le": format_le(le)}, cumulative))
        deltas.append((f"{DURATION}_sum", {}, total))
        deltas.append((f"{DURATION}_count", {}, count))
        deltas += [(REJECTED, {"code": str(code)}, n) for code, n in sorted(codes.items())]
        return deltas

    def restore(self, deltas: list[tuple[str, dict[str, str], float]]) -> None:
        """Put drained counts back (their flush failed), to be added with the next flush."""
        with self._lock:
            previous = 0.0
            for name, labels, value in deltas:
                if name == f"{DURATION}_bucket":
                    index = [format_le(b) for b in LATENCY_BUCKETS].index(labels["le"])
                    self._buckets[index] += int(value - previous)
                    previous = value
                elif name == f"{DURATION}_sum":
                    self._sum += value
                elif name == REJECTED:
                    code = int(labels["code"])
                    self._codes[code] = self._codes.get(code, 0) + int(value)


def format_le(le: float) -> str:
    return "+Inf" if le == float("inf") else repr(float(le))


class IngestMetricsMiddleware:
    """Pure ASGI (no BaseHTTPMiddleware: that would copy every request body through a queue)."""

    def __init__(self, app, recorder: IngestRecorder, path: str = INGEST_PATH):
        self.app = app
        self.recorder = recorder
        self.path = path

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != self.path or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # an exception that escapes the app becomes a 500 further out

        async def send_status(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            self.recorder.observe(status, time.perf_counter() - started)
