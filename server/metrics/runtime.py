"""Wiring into the app: install() when the app is built, start() in its lifespan."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI
from sqlalchemy import Engine

from agent.metrics import Renderer
from server.metrics.collector import LaggardCollector
from server.metrics.ingest import IngestMetricsMiddleware, IngestRecorder
from server.metrics.maintainer import MetricsMaintainer


def install(app: FastAPI) -> None:
    """The ingest timing middleware, and the registry of this process's own process_*/python_* series."""
    from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector

    recorder = IngestRecorder()
    app.state.ingest_metrics = recorder
    app.state.metrics_renderer = Renderer()
    app.add_middleware(IngestMetricsMiddleware, recorder=recorder)
    registry = CollectorRegistry(auto_describe=True)
    for collector in (ProcessCollector, PlatformCollector, GCCollector):
        collector(registry=registry)
    app.state.process_registry = registry


def start(app: FastAPI, engine: Engine, *, is_leader: Callable[[], bool], receivers: Callable[[], list[str]]) -> MetricsMaintainer:
    settings = app.state.settings
    app.state.metrics_collector = LaggardCollector(engine, settings, receivers=receivers, hints=_hints_source(app))
    maintainer = MetricsMaintainer(engine, settings.metrics, app.state.ingest_metrics, is_leader=is_leader)
    maintainer.start()
    app.state.metrics_maintainer = maintainer
    return maintainer


def _hints_source(app: FastAPI) -> Callable[[], dict] | None:
    """Issue #4's hints through the app's hints cache (shared with GET /api/v1/hints), if present."""
    try:
        from server.api.hints import hints_cache
    except ImportError:
        return None
    return lambda: hints_cache(app).get(None).doc
