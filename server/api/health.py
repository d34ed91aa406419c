"""Liveness and readiness for Kubernetes probes."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy import text

from server.services import ServicesDep

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="The process is alive")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", summary="The database answers and takes writes", responses={503: {}})
def readyz(services: ServicesDep) -> JSONResponse:
    try:
        with services.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:  # any failure to reach the database means "not ready"
        return JSONResponse({"status": "unavailable", "database": type(exc).__name__}, status_code=503)
    # Answering is not enough: a full disk still answers SELECT 1 and refuses every push.
    if (failure := services.write_health.failing()) is not None:
        return JSONResponse({"status": "unavailable", "database": "ok", "writes": failure}, status_code=503)
    return JSONResponse({"status": "ok", "database": "ok", "writes": "ok", "detection": _detection(services)})


def _detection(services: Any) -> dict | None:  # server/app.py Services
    """What this process does for detection: whether it leads (alert dispatch, shared metrics)
    and which clusters it judges (server/detect/leases.py)."""
    detection = services.detection
    if not services.settings.detector.enabled:
        return None
    return {"leader": detection.lock.held, "clusters": list(detection.clusters)}
