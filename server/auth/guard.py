"""Authentication and scope checks as FastAPI dependencies.

A presented token is looked up once and then remembered for `cache_s` seconds per process, so
the ingest path costs a dictionary lookup, not a query; a revoked token therefore stops working
within `cache_s` (LAGGARD_AUTH__TOKEN_CACHE_S, 10 s by default) on every worker and replica."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import Engine

from server.auth.ratelimit import RateLimiter, retry_after_header
from server.auth.settings import AuthSettings
from server.auth.store import principal_for
from server.auth.tokens import ANONYMOUS, Principal, token_hash
from server.errors import ApiError
from server.services import services
from server.store.engine import database_unavailable

_bearer = HTTPBearer(auto_error=False, description="`Authorization: Bearer lgd_…` (laggard token create)")
_CACHE_MAX = 10_000


class Authenticator:
    def __init__(self, engine: Engine | None, *, insecure: bool, cache_s: float = 10.0, limiter: RateLimiter | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.engine, self.insecure, self.cache_s, self.limiter, self._clock = engine, insecure, cache_s, limiter, clock
        self._cache: dict[str, tuple[Principal | None, float]] = {}

    @classmethod
    def from_settings(cls, engine: Engine | None, cfg: AuthSettings) -> Authenticator:
        """The authenticator the auth section describes: insecure, token cache and rate limit."""
        return cls(engine, insecure=cfg.insecure, cache_s=cfg.token_cache_s,
                   limiter=RateLimiter(rate=cfg.rate_limit_per_s, burst=cfg.rate_limit_burst))

    async def principal(self, token: str | None) -> Principal:
        if self.insecure:
            return ANONYMOUS
        if not token:
            raise _unauthorized("missing bearer token: send Authorization: Bearer <token>")
        key, now = token_hash(token), self._clock()
        cached = self._cache.get(key)
        if cached is None or cached[1] <= now:
            found = await asyncio.to_thread(self._lookup, token)
            if len(self._cache) >= _CACHE_MAX:
                self._cache.clear()
            cached = self._cache[key] = (found, now + self.cache_s)
        if cached[0] is None:
            raise _unauthorized("unknown or revoked token")
        return cached[0]

    def _lookup(self, token: str) -> Principal | None:
        try:
            with self.engine.connect() as conn:
                return principal_for(conn, token=token)
        except Exception as exc:
            if database_unavailable(exc):
                raise ApiError(503, "database unavailable: cannot check the token", loc=["database"], type="unavailable",
                               headers={"Retry-After": "5"}) from exc
            raise

    def throttle(self, principal: Principal) -> None:
        if self.limiter is None or not principal.key_id:
            return
        wait = self.limiter.take(principal.key_id)
        if wait > 0:
            raise ApiError(429, f"rate limit of {self.limiter.rate:g} requests/s for this token exceeded", loc=["header", "authorization"],
                           type="rate_limited", headers={"Retry-After": retry_after_header(wait)})


def _unauthorized(msg: str) -> ApiError:
    return ApiError(401, msg, loc=["header", "authorization"], type="unauthorized", headers={"WWW-Authenticate": 'Bearer realm="laggard"'})


def require(*scopes: str):
    """A dependency that lets the request through if its token has one of `scopes` (admin has
    them all), and leaves the Principal in request.state.principal."""

    async def check(request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> Principal:
        auth = services(request).auth
        principal = await auth.principal(credentials.credentials if credentials else None)
        if not any(principal.allows(s) for s in scopes):
            raise ApiError(403, f"this token lacks the scope {' or '.join(scopes)}", loc=["header", "authorization"], type="forbidden")
        auth.throttle(principal)
        request.state.principal = principal
        return principal

    check.__name__ = f"require_{'_or_'.join(scopes)}"
    return check
