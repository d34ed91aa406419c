"""The collector application. Everything stateful is built here from the given Settings;
nothing lives at module level, so tests build as many apps as they like."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from sqlalchemy import Engine
from starlette.requests import ClientDisconnect

from server import __version__, interpreter, memory
from server.alerts import runtime as alerts_runtime
from server.alerts.dispatcher import AlertDispatcher
from server.api import (
    docs,
    gpus,
    health,
    metrics,
    nodes,
    stragglers,
)
from server.api.text_params import refuse_control_characters
from server.auth import router as tokens_router
from server.auth import self_router as token_self_router
from server.auth.guard import Authenticator, require
from server.auth.tokens import ADMIN, AGENT, READ, SCHEDULER, SCOPES
from server.detect.service import DetectionService
from server.errors import ApiError, pydantic_details
from server.hints import acks_router, extender_router
from server.hints import router as hints_router
from server.hints.held import held_fault_ids
from server.hints.service import HintsCache
from server.ingest import router as ingest_router
from server.ingest.admission import Admission
from server.ingest.body_deadline import BodyDeadline, BodyTimeout, body_timeout_error, client_gone
from server.metrics import runtime as metrics_runtime
from server.metrics.runtime import MetricsRuntime
from server.protocol import BATCH
from server.settings import RetentionSettings, Settings, replica_name
from server.store import migrate
from server.store.engine import make_engine
from server.store.partitions import ensure_partitions
from server.store.retention import Horizons, apply_retention
from server.store.rollups import roll_up
from server.store.write_health import WriteHealth
from server.store.writer import IngestWriter
from server.store.writer_service import RemoteWriter
from server.ui import router as ui

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Services:
    """Everything stateful the routers use, built once per run of the lifespan: the app state's
    only attribute (server/services.py hands it to the domains)."""

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


def create_app(settings: Settings) -> FastAPI:
    # What the app has before it starts (the middleware counts into the metrics' recorder); the
    # rest is built in the lifespan, and all of it handed to routers as one Services object.
    write_health = WriteHealth(hold_s=settings.writer.failure_unready_s)
    instruments = metrics_runtime.instruments()
    lifespan = functools.partial(_lifespan, settings=settings, write_health=write_health, instruments=instruments)
    # /docs and /redoc: server/api/docs.py, whose pages load nothing from CDNs (air-gapped clusters).
    app = FastAPI(title="Laggard collector", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None)
    for module, scopes in _router_scopes(settings):
        guard = [Depends(require(*scopes))] if scopes else []
        app.include_router(module.router, dependencies=[*guard, Depends(refuse_control_characters)])
    if settings.auth.insecure:
        log.warning("AUTHENTICATION IS OFF (LAGGARD_AUTH__INSECURE): anyone who reaches this collector can push samples, "
                    "read everything and drain nodes. Use it for demos and tests only.")
    metrics_runtime.install(app, instruments)  # ingest timing middleware (issue #5)
    app.add_middleware(BodyDeadline, timeout_s=settings.ingest.body_timeout_s)
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(BodyTimeout, body_timeout_error)
    app.add_exception_handler(ClientDisconnect, client_gone)
    app.add_exception_handler(Exception, _unexpected_error)
    app.openapi = lambda: _openapi(app)
    return app


def _router_scopes(settings: Settings) -> list[tuple[object, tuple[str, ...]]]:
    """Each router and the scopes that open it (admin opens all; none: open to anyone)."""
    return [
        (ingest_router, (AGENT,)),
        (nodes, (READ,)),
        (gpus, (READ,)),
        (stragglers, (READ,)),
        (hints_router, (READ, SCHEDULER)),
        (extender_router, () if settings.auth.scheduler_public else (SCHEDULER,)),
        (metrics, () if settings.auth.metrics_public else (READ,)),
        (tokens_router, (ADMIN,)),
        (token_self_router, SCOPES),
        (acks_router, (ADMIN,)),
        (health, ()),
        (docs, ()),
        (ui, ()),  # the status page checks the read scope itself: a login form for browsers (server/ui/auth.py)
    ]


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI, *, settings: Settings, write_health: WriteHealth,
                    instruments: metrics_runtime.Instruments) -> AsyncIterator[None]:
    routes = alerts_runtime.routing(settings.alerts)  # a bad routes file fails the start, before anything runs
    engine = make_engine(settings.database_url, sqlite_mmap_mb=settings.sqlite_mmap_mb)
    if settings.migrate_on_start:
        migrate.upgrade(engine)
    writer = _ingest_writer(settings, engine)
    writer.start()
    auth = Authenticator.from_settings(engine, settings.auth)
    admission = Admission(settings.ingest_limits, engine)
    replica = replica_name(settings)
    detection = DetectionService(engine, settings.detection, poll_s=settings.detector.poll_s,
                                 leader_retry_s=settings.detector.leader_retry_s, replica=replica)
    if settings.detector.enabled:
        detection.start()
    # Alert dispatch and the shared metric counters act where detection leads (issue #5).
    dispatcher = alerts_runtime.start(engine, routes, settings.alerts, external_url=alerts_runtime.external_url(settings),
                                      is_leader=lambda: detection.lock.held)
    # /metrics shows the hints GET /api/v1/hints serves, handed over here: metrics import no hints.
    hint_cache = HintsCache(engine, settings.hints)
    metrics = metrics_runtime.start(instruments, engine, settings.metrics, min_peers=settings.detection.min_peers,
                                    is_leader=lambda: detection.lock.held, receivers=routes.names, replica=replica,
                                    hints=lambda: hint_cache.get(None).doc)
    app.state.services = Services(settings=settings, engine=engine, writer=writer, write_health=write_health, auth=auth,
                                  admission=admission, detection=detection, hints=hint_cache, alerts=dispatcher, metrics=metrics)
    retention = asyncio.create_task(_retention_loop(settings.retention, engine, hold_until_remedy=settings.hints.hold_until_remedy))
    # Rollups are idempotent, but one process doing them is enough: the one that leads detection
    # (each process where detection is off, since none of those may ever lead).
    rolling = asyncio.create_task(_rollup_loop(settings.retention, engine, lambda: detection.lock.held or not settings.detector.enabled,
                                               delay_s=settings.detection.lateness_s))
    trimming = asyncio.create_task(_trim_loop(settings.memory_trim_interval_s))
    interpreter.set_switch_interval(settings.gil_switch_interval_s)
    interpreter.freeze_once()
    try:
        yield
    finally:
        retention.cancel()
        rolling.cancel()
        trimming.cancel()
        await asyncio.to_thread(dispatcher.stop)
        await asyncio.to_thread(metrics.maintainer.stop)
        await asyncio.to_thread(detection.stop)
        with contextlib.suppress(asyncio.CancelledError):
            await retention
        with contextlib.suppress(asyncio.CancelledError):
            await rolling
        # Requests still waiting on the writer get their commit before the engine goes away.
        await asyncio.to_thread(writer.stop)
        engine.dispose()


def _ingest_writer(settings: Settings, engine) -> IngestWriter | RemoteWriter:
    cfg = settings.writer
    if cfg.socket and cfg.key:
        return RemoteWriter(cfg.socket, bytes.fromhex(cfg.key.get_secret_value()))
    return IngestWriter(engine, threads=cfg.threads_for(settings.is_sqlite), group_max=cfg.group_max_bodies,
                        gpu_move_after_s=settings.ingest.gpu_move_after_s, slice_rows=cfg.slice_rows,
                        small_rows=cfg.small_rows, heavy_wait_s=cfg.heavy_wait_s)


async def _trim_loop(interval_s: float) -> None:
    while interval_s > 0:
        await asyncio.sleep(interval_s)
        await asyncio.to_thread(memory.trim)


async def _retention_loop(cfg: RetentionSettings, engine, *, hold_until_remedy: bool) -> None:
    while True:
        try:
            # Day partitions ahead of sample time (PostgreSQL; server/store/partitions.py), at
            # start and then every retention interval, in every replica (they serialise).
            created = await asyncio.to_thread(ensure_partitions, engine)
            if created:
                log.info("created partitions %s", created)
        except Exception:
            log.exception("creating partitions failed; samples go to the default partition meanwhile")
        try:
            deleted = await asyncio.to_thread(
                apply_retention, engine, now=time.time(), horizons=_horizons(cfg),
                keep_episodes=held_fault_ids if hold_until_remedy else None,
            )
            if any(deleted.values()):
                log.info("retention deleted %s", deleted)
        except Exception:
            log.exception("retention failed; will retry")
        await asyncio.sleep(cfg.interval_s)


def _horizons(cfg: RetentionSettings) -> Horizons:
    return Horizons(raw_s=cfg.raw_s, rollup_s=cfg.rollup_days * 86400, events_s=cfg.event_days * 86400)


async def _rollup_loop(cfg: RetentionSettings, engine, leads: Callable[[], bool], *, delay_s: float) -> None:
    while True:
        await asyncio.sleep(cfg.rollup_interval_s)
        if not leads():
            continue
        try:
            written = await asyncio.to_thread(roll_up, engine, now=time.time(), delay_s=delay_s, keep_raw_s=cfg.raw_s)
            log.debug("rolled up %s", written)
        except Exception:
            log.exception("rolling up failed; will retry")


async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
    return JSONResponse({"detail": exc.detail}, status_code=exc.status, headers=exc.headers)


async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
    # FastAPI's own 422 adds "input", "ctx" and "url"; answer in the shape ingest uses.
    return JSONResponse({"detail": pydantic_details(exc.errors())}, status_code=422)


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    detail = [{"loc": [], "msg": f"internal error: {type(exc).__name__}", "type": "internal"}]
    # Starlette re-raises after this answer and uvicorn then drops the connection: say so, so
    # that a keep-alive client does not send its next request into a closed socket.
    return JSONResponse({"detail": detail}, status_code=500, headers={"Connection": "close"})


def _openapi(app: FastAPI) -> dict:
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        # The ingest route reads its body by hand (limits, gzip); publish the protocol schema anyway.
        batch = BATCH.json_schema(ref_template="#/components/schemas/{model}")
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components.update(batch.pop("$defs", {}))
        components["Batch"] = batch
        app.openapi_schema = schema
    return app.openapi_schema
