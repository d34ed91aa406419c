"""The collector's services: everything stateful the routers use, in one typed object.

The app builds one `Services` per run of its lifespan (server/app.py) and keeps it as the one
attribute of its state; routers ask for it, or for a piece of it, through the typed dependencies
here and in their own domain (server/hints/router.py has the hints cache and settings), or, on
the ingest hot path and in the auth guard, through `services(request)`: no router reads the
app's state itself.

Outputs (alerts, hints, metrics) may import this module: it imports none of the parts at run
time (their types are for the type checker only), so an output importing it imports no other
output, nor the detector, nor the API."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Request
from sqlalchemy import Engine

if TYPE_CHECKING:
    from server.alerts.dispatcher import AlertDispatcher
    from server.auth.guard import Authenticator
    from server.detect.service import DetectionService
    from server.hints.service import HintsCache
    from server.ingest.admission import Admission
    from server.metrics.runtime import MetricsRuntime
    from server.settings import Settings
    from server.store.write_health import WriteHealth
    from server.store.writer import IngestWriter
    from server.store.writer_service import RemoteWriter


@dataclass(frozen=True, slots=True)
class Services:
    settings: Settings
    engine: Engine
    writer: IngestWriter | RemoteWriter  # in-process, or the shared writer process of --workers on SQLite
    write_health: WriteHealth  # what /readyz says about the last pushes' writes
    auth: Authenticator  # token lookup (cached), rate limit
    admission: Admission  # ingest limits by work
    detection: DetectionService
    hints: HintsCache  # the hints GET /api/v1/hints, the extender, the status page and /metrics serve
    alerts: AlertDispatcher
    metrics: MetricsRuntime  # what GET /metrics renders from


def services(request: Request) -> Services:
    """The app's services (set in its lifespan: a request can only come once they are there).
    One attribute read: the ingest route and the auth guard call this directly."""
    return request.app.state.services


# Dependencies are coroutines: FastAPI would run a plain function on the thread pool.
async def _services(request: Request) -> Services:
    return services(request)


async def _engine(request: Request) -> Engine:
    return services(request).engine


ServicesDep = Annotated[Services, Depends(_services)]
EngineDep = Annotated[Engine, Depends(_engine)]
