"""One GPU's time series."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Query

from server.api.deps import ConnDep
from server.errors import ApiError
from server.protocol import GPU_METRICS
from server.store import queries, workloads

router = APIRouter(prefix="/api/v1/gpus", tags=["gpus"])

MAX_POINTS = 10_000


@router.get("/{uuid}/series", summary="One metric of one GPU over a time range", responses={404: {}, 422: {}})
def gpu_series(
    uuid: str,
    conn: ConnDep,
    metric: str = Query(..., description=f"one of: {', '.join(GPU_METRICS)}"),
    since: float | None = Query(None, allow_inf_nan=False, description="epoch seconds; default: one hour before `until`"),
    until: float | None = Query(None, allow_inf_nan=False, description="epoch seconds; default: now"),
    limit: int = Query(MAX_POINTS, ge=1, le=MAX_POINTS),
) -> dict[str, Any]:
    if metric not in GPU_METRICS:
        raise ApiError(422, f"unknown metric {metric!r}; expected one of {list(GPU_METRICS)}", loc=["query", "metric"], type="unknown_metric")
    until = time.time() if until is None else until
    since = until - 3600 if since is None else since
    if since > until:
        raise ApiError(422, "since is after until", loc=["query", "since"], type="bad_range")
    gpu = queries.gpu_by_uuid(conn, uuid=uuid)
    if gpu is None:
        raise ApiError(404, f"unknown GPU {uuid!r}", loc=["path", "uuid"], type="not_found")
    points = queries.gpu_series(conn, gpu_id=gpu["id"], metric=metric, since=since, until=until, limit=limit)
    return {
        "uuid": uuid,
        "node": gpu["node"],
        "cluster": gpu["cluster"],
        "index": gpu["index"],
        "metric": metric,
        "since": since,
        "until": until,
        "points": [[ts, value] for ts, value in points],
    }


@router.get("/{uuid}/workloads", summary="What used one GPU over a time range (its workload changes)", responses={404: {}, 422: {}})
def gpu_workloads(
    uuid: str,
    conn: ConnDep,
    since: float | None = Query(None, allow_inf_nan=False, description="epoch seconds; default: one day before `until`"),
    until: float | None = Query(None, allow_inf_nan=False, description="epoch seconds; default: now"),
    limit: int = Query(MAX_POINTS, ge=1, le=MAX_POINTS),
) -> dict[str, Any]:
    """The workload in effect at `since` and each change up to `until`, oldest first. A
    workload null: unknown (the agent could not tell, or sent none); kind null: idle."""
    until = time.time() if until is None else until
    since = until - 86400 if since is None else since
    if since > until:
        raise ApiError(422, "since is after until", loc=["query", "since"], type="bad_range")
    gpu = queries.gpu_by_uuid(conn, uuid=uuid)
    if gpu is None:
        raise ApiError(404, f"unknown GPU {uuid!r}", loc=["path", "uuid"], type="not_found")
    return {
        "uuid": uuid,
        "node": gpu["node"],
        "cluster": gpu["cluster"],
        "index": gpu["index"],
        "since": since,
        "until": until,
        "workloads": workloads.history(conn, gpu_id=gpu["id"], since=since, until=until, limit=limit),
    }
