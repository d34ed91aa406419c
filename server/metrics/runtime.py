"""Wiring into the app: install() when the app is built, start() in its lifespan."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi import FastAPI
from sqlalchemy import Engine

from agent.exposition import Renderer
from server.metrics.collector import LaggardCollector
from server.metrics.exporter import FleetExporter
from server.metrics.ingest import IngestMetricsMiddleware, IngestRecorder
from server.metrics.maintainer import MetricsMaintainer
from server.metrics.selection import Selection
from server.metrics.settings import MetricsSettings

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

MAX_SLICE_RENDERERS = 64  # slices whose line heads are kept between scrapes


@dataclass(slots=True)
class Instruments:
    """What the app has from the start: the ingest timing middleware's counts, the registry of
    this process's own process_*/python_* series, and the text writers of the scrapes."""
    recorder: IngestRecorder
    process_registry: CollectorRegistry
    renderer: Renderer = field(default_factory=Renderer)
    slice_renderers: dict[Selection, Renderer] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class MetricsRuntime:
    """What GET /metrics renders from (Services.metrics)."""
    settings: MetricsSettings
    instruments: Instruments
    exporter: FleetExporter
    collector: LaggardCollector
    maintainer: MetricsMaintainer


def instruments() -> Instruments:
    """The ingest recorder, and the registry of this process's own process_*/python_* series."""
    from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector

    registry = CollectorRegistry(auto_describe=True)
    for collector in (ProcessCollector, PlatformCollector, GCCollector):
        collector(registry=registry)
    return Instruments(recorder=IngestRecorder(), process_registry=registry)


def install(app: FastAPI, instruments: Instruments) -> None:
    """The ingest timing middleware, counting into the instruments' recorder."""
    app.add_middleware(IngestMetricsMiddleware, recorder=instruments.recorder)


def start(instruments: Instruments, engine: Engine, cfg: MetricsSettings, *, min_peers: int, is_leader: Callable[[], bool],
          receivers: Callable[[], list[str]], replica: str, hints: Callable[[], dict] | None = None) -> MetricsRuntime:
    """`hints`: the current hints document (the app wires the one GET /api/v1/hints serves);
    `replica`: this process's replica, as the detection leader names its own."""
    exporter = FleetExporter(engine, replica)
    collector = LaggardCollector(engine, cfg, min_peers=min_peers, receivers=receivers, hints=hints)
    maintainer = MetricsMaintainer(engine, cfg, instruments.recorder, is_leader=is_leader)
    maintainer.start()
    return MetricsRuntime(settings=cfg, instruments=instruments, exporter=exporter, collector=collector, maintainer=maintainer)


def renderer_for(instruments: Instruments, selection: Selection) -> Renderer:
    """The text writer of a selection. One per slice: a Renderer keeps each family's line heads
    from its last scrape, which slices taking turns would overwrite every time."""
    if selection.whole:
        return instruments.renderer
    renderers = instruments.slice_renderers
    if selection not in renderers and len(renderers) >= MAX_SLICE_RENDERERS:
        renderers.clear()
    return renderers.setdefault(selection, Renderer())
