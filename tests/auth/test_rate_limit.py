"""The per-token rate limit: 429 with Retry-After past the burst, per token."""

from __future__ import annotations

from server.auth.ratelimit import RateLimiter
from server.settings import Settings
from tests.auth.conftest import SecureCollector


def test_bucket_refills_at_the_rate():
    now = [0.0]
    limiter = RateLimiter(rate=2.0, burst=3, clock=lambda: now[0])
    assert [limiter.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.take("a") == 0.5  # one more needs half a second at 2/s
    assert limiter.take("b") == 0.0  # buckets are per token
    now[0] += 0.5
    assert limiter.take("a") == 0.0
    assert limiter.take("a") > 0


def test_429_with_retry_after_past_the_burst_and_other_tokens_unaffected(sqlite_url):
    c = SecureCollector(Settings(database_url=sqlite_url, insecure=False, detection_enabled=False, rate_limit_per_s=0.2, rate_limit_burst=3))
    try:
        busy, quiet = c.token("read"), c.token("read")
        with c.client(busy) as http:
            codes = [http.get("/api/v1/nodes").status_code for _ in range(5)]
            assert codes == [200, 200, 200, 429, 429]
            r = http.get("/api/v1/nodes")
            assert r.status_code == 429 and 1 <= int(r.headers["retry-after"]) <= 5
            assert r.json()["detail"][0]["type"] == "rate_limited"
        with c.client(quiet) as http:
            assert http.get("/api/v1/nodes").status_code == 200
    finally:
        c.close()
