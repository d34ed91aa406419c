"""Straggler episodes: what is wrong now, and what was wrong when."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Query

from server.api.deps import ConnDep
from server.errors import ApiError
from server.store import episodes

router = APIRouter(prefix="/api/v1/stragglers", tags=["stragglers"])

Cause = Literal["thermal", "power", "hw_slowdown", "clock", "nvlink", "pcie", "network", "xid", "ecc", "lost"]


@router.get("", summary="Active straggler episodes")
def active(
    conn: ConnDep,
    cluster: str | None = None,
    node: str | None = None,
    cause: Cause | None = None,
    severity: Literal["warning", "critical"] | None = None,
    job: str | None = Query(None, description="the job the GPU was attributed to: a Kubernetes job (else pod) or a Slurm job name"),
) -> dict[str, Any]:
    return {"stragglers": episodes.active_episodes(conn, cluster=cluster, node=node, cause=cause, severity=severity, job=job)}


@router.get("/history", summary="Every episode that overlaps a range of sample time", responses={422: {}})
def history(
    conn: ConnDep,
    since: float = Query(..., allow_inf_nan=False, description="epoch seconds (sample time)"),
    until: float = Query(..., allow_inf_nan=False, description="epoch seconds (sample time)"),
    cluster: str | None = None,
    job: str | None = Query(None, description="the job the GPU was attributed to: a Kubernetes job (else pod) or a Slurm job name"),
) -> dict[str, Any]:
    if since > until:
        raise ApiError(422, "since is after until", loc=["query", "since"], type="bad_range")
    return {"stragglers": episodes.episodes_between(conn, since=since, until=until, cluster=cluster, job=job)}
