"""Liveness and readiness for Kubernetes probes."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy import text

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="The process is alive")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", summary="The database answers and takes writes", responses={503: {}})
def readyz(request: Request) -> JSONResponse:
    try:
        with request.app.state.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:  # any failure to reach the database means "not ready"
        return JSONResponse({"status": "unavailable", "database": type(exc).__name__}, status_code=503)
    # Answering is not enough: a full disk still answers SELECT 1 and refuses every push.
    if (failure := request.app.state.write_health.failing()) is not None:
        return JSONResponse({"status": "unavailable", "database": "ok", "writes": failure}, status_code=503)
    return JSONResponse({"status": "ok", "database": "ok", "writes": "ok", "detection": _detection(request)})


def _detection(request: Request) -> dict | None:
    """What this process does for detection: whether it leads (alert dispatch, shared metrics)
    and which clusters it judges (server/detect/leases.py)."""
    detection = getattr(request.app.state, "detection", None)
    if detection is None or not request.app.state.settings.detection_enabled:
        return None
    return {"leader": detection.lock.held, "clusters": list(detection.clusters)}
