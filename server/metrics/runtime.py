"""Wiring into the app: install() when the app is built, start() in its lifespan."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI
from sqlalchemy import Engine

from agent.exposition import Renderer
from server.metrics.collector import LaggardCollector
from server.metrics.exporter import FleetExporter
from server.metrics.ingest import IngestMetricsMiddleware, IngestRecorder
from server.metrics.maintainer import MetricsMaintainer
from server.metrics.selection import Selection

MAX_SLICE_RENDERERS = 64  # slices whose line heads are kept between scrapes


def install(app: FastAPI) -> None:
    """The ingest timing middleware, and the registry of this process's own process_*/python_* series."""
    from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector

    recorder = IngestRecorder()
    app.state.ingest_metrics = recorder
    app.state.metrics_renderer = Renderer()
    app.state.metrics_slice_renderers = {}
    app.add_middleware(IngestMetricsMiddleware, recorder=recorder)
    registry = CollectorRegistry(auto_describe=True)
    for collector in (ProcessCollector, PlatformCollector, GCCollector):
        collector(registry=registry)
    app.state.process_registry = registry


def start(app: FastAPI, engine: Engine, *, is_leader: Callable[[], bool], receivers: Callable[[], list[str]], replica: str,
          hints: Callable[[], dict] | None = None) -> MetricsMaintainer:
    """`hints`: the current hints document (the app wires the one GET /api/v1/hints serves);
    `replica`: this process's replica, as the detection leader names its own."""
    settings = app.state.settings
    app.state.fleet_exporter = FleetExporter(engine, replica)
    app.state.metrics_collector = LaggardCollector(engine, settings.metrics, min_peers=settings.detection.min_peers, receivers=receivers,
                                                   hints=hints)
    maintainer = MetricsMaintainer(engine, settings.metrics, app.state.ingest_metrics, is_leader=is_leader)
    maintainer.start()
    app.state.metrics_maintainer = maintainer
    return maintainer


def renderer_for(state, selection: Selection) -> Renderer:
    """The text writer of a selection. One per slice: a Renderer keeps each family's line heads
    from its last scrape, which slices taking turns would overwrite every time."""
    if selection.whole:
        return state.metrics_renderer
    renderers: dict[Selection, Renderer] = state.metrics_slice_renderers
    if selection not in renderers and len(renderers) >= MAX_SLICE_RENDERERS:
        renderers.clear()
    return renderers.setdefault(selection, Renderer())
