"""GET /metrics: Prometheus text format (docs/observability.md)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from agent.exposition import CONTENT_TYPE
from server.compression import maybe_gzipped
from server.errors import ApiError
from server.metrics.runtime import renderer_for
from server.metrics.selection import Selection, SelectionError, parse_selection
from server.services import ServicesDep

router = APIRouter(tags=["metrics"])

_SELECTION_PARAMETERS = [
    {"name": "cluster", "in": "query", "required": False, "schema": {"type": "array", "items": {"type": "string"}},
     "description": "Only the series of these clusters (repeatable); cluster= (empty) selects the series without a cluster label."},
    {"name": "shard", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 0},
     "description": "With shards: this scrape's shard, 0 to shards-1 (docs/observability.md, splitting the fleet)."},
    {"name": "shards", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 1},
     "description": "With shard: how many shards the fleet is split into."},
]


@router.get("/metrics", summary="Prometheus metrics (text format 0.0.4); ?cluster= and ?shard=&shards= scrape a slice",
            response_class=Response, responses={200: {"content": {"text/plain": {}}}, 400: {}, 404: {}},
            openapi_extra={"parameters": _SELECTION_PARAMETERS})
def metrics(request: Request, services: ServicesDep) -> Response:
    # Plain def: the database reads run on the thread pool, not on the event loop.
    runtime = services.metrics
    settings = runtime.settings
    if not settings.enabled:
        raise ApiError(404, "metrics are turned off (LAGGARD_METRICS__ENABLED=false)", loc=["path"], type="not_found")
    selection = _selection(request)
    exporter = runtime.exporter
    exports = exporter.exports()
    # The fleet's series once, however many replicas are scraped (server/metrics/exporter.py).
    families = runtime.collector.families(selection) if exports else []
    # This replica's own series go with the series that name no cluster: once per split.
    own = [exporter.family(exports)] if selection.takes_unclustered else []
    body = renderer_for(runtime.instruments, selection).render([*families, *own])
    if settings.process_series and selection.takes_unclustered:
        from prometheus_client import generate_latest

        body += generate_latest(runtime.instruments.process_registry).decode()
    return maybe_gzipped(request, body.encode(), CONTENT_TYPE)


def _selection(request: Request) -> Selection:
    try:
        return parse_selection(request.query_params.multi_items())
    except SelectionError as exc:
        raise ApiError(400, str(exc), loc=["query", exc.parameter], type="invalid_selection") from exc
