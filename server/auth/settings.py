"""Settings of authentication and the per-token rate limit (LAGGARD_AUTH__<NAME>; docs/security.md).
The flat names of earlier versions (LAGGARD_INSECURE, LAGGARD_TOKEN_CACHE_S, ...) still set them
(server/settings.py, LEGACY_NAMES)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class AuthSettings(BaseModel):
    insecure: bool = Field(
        False, description="Turn authentication off (LAGGARD_AUTH__INSECURE=1, or laggard server --insecure): anyone may push, "
                           "read and drain. Demo and tests only.",
    )
    metrics_public: bool = Field(False, description="Serve GET /metrics without a token (else: a token with the read scope).")
    scheduler_public: bool = Field(
        False, description="Serve the kube-scheduler extender (/scheduler/*) without a token: kube-scheduler cannot send one; "
                           "restrict who reaches it (NetworkPolicy) instead.",
    )
    token_cache_s: float = Field(10.0, description="How long a worker trusts a looked-up token (a revoked one works at most this long).")
    rate_limit_per_s: float = Field(
        200.0, description="Requests per second per token, per process, on average (429 beyond). One agent token shared by a "
                           "cluster sends about nodes / push interval: 1,000 nodes every 5 s is 200/s.",
    )
    rate_limit_burst: float = Field(400.0, description="Requests a token may send at once before the rate limit applies.")
