"""GET /metrics: Prometheus text format (docs/observability.md)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from agent.exposition import CONTENT_TYPE
from server.errors import ApiError

router = APIRouter(tags=["metrics"])


@router.get("/metrics", summary="Prometheus metrics (text format 0.0.4)", response_class=Response,
            responses={200: {"content": {"text/plain": {}}}, 404: {}})
def metrics(request: Request) -> Response:
    # Plain def: the database reads run on the thread pool, not on the event loop.
    state = request.app.state
    settings = state.settings.metrics
    if not settings.enabled:
        raise ApiError(404, "metrics are turned off (LAGGARD_METRICS__ENABLED=false)", loc=["path"], type="not_found")
    exporter = state.fleet_exporter
    exports = exporter.exports()
    # The fleet's series once, however many replicas are scraped (server/metrics/exporter.py).
    families = state.metrics_collector.families() if exports else []
    body = state.metrics_renderer.render([*families, exporter.family(exports)])
    if settings.process_series:
        from prometheus_client import generate_latest

        body += generate_latest(state.process_registry).decode()
    return Response(body, media_type=CONTENT_TYPE)
