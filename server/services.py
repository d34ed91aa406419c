"""How routers reach the collector's services: one accessor and the dependencies every domain shares.

The app composes everything stateful into one typed `Services` (server/app.py, the composition
root) per run of its lifespan and keeps it as the one attribute of its state. A domain cannot
import the app that composes it (its arrows would point up), so this module, below every domain,
hands the object over untyped, and each domain turns it into its own typed dependencies
(server/hints/router.py: the hints cache and settings; server/api/deps.py: a connection; the
engine, which every domain may need, here). On the ingest hot path and in the auth guard,
`services(request)` is one attribute read and no dependency chain."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request
from sqlalchemy import Engine


def services(request: Request) -> Any:
    """The app's services (set in its lifespan: a request can only come once they are there).
    One attribute read: the ingest route and the auth guard call this directly."""
    return request.app.state.services


# Dependencies are coroutines: FastAPI would run a plain function on the thread pool.
async def _services(request: Request) -> Any:
    return services(request)


async def _engine(request: Request) -> Engine:
    return services(request).engine


ServicesDep = Annotated[Any, Depends(_services)]  # server/app.py Services
EngineDep = Annotated[Engine, Depends(_engine)]
