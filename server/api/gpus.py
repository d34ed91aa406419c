"""One GPU's time series."""

from __future__ import annotations

import math
import time
from typing import Any, Literal

from fastapi import APIRouter, Query

from server.api.deps import ConnDep, RawRetentionDep
from server.errors import ApiError
from server.protocol import GPU_METRICS
from server.store import queries, rollups, workloads

router = APIRouter(prefix="/api/v1/gpus", tags=["gpus"])

MAX_POINTS = 10_000
# `resolution=auto` serves raw samples for a range up to this long that they still cover, and
# per-minute rollups otherwise (a day of raw samples at 1 s is 86,400 points).
RAW_RANGE_S = 6 * 3600


@router.get("/{uuid}/series", summary="One metric of one GPU over a time range", responses={404: {}, 422: {}})
def gpu_series(
    uuid: str,
    conn: ConnDep,
    raw_retention_s: RawRetentionDep,
    metric: str = Query(..., description=f"one of: {', '.join(GPU_METRICS)}"),
    since: float | None = Query(None, allow_inf_nan=False, description="epoch seconds; default: one hour before `until`"),
    until: float | None = Query(None, allow_inf_nan=False, description="epoch seconds; default: now"),
    limit: int = Query(MAX_POINTS, ge=1, le=MAX_POINTS),
    resolution: Literal["auto", "raw", "1m"] = Query(
        "auto", description="raw samples, per-minute rollups (a gauge's mean, min and max; any other reading's last value), "
                            "or auto: raw for a range of up to 6 h that raw samples still cover, rollups otherwise",
    ),
) -> dict[str, Any]:
    """The response's `resolution` says which was served and `columns` what each point holds."""
    if metric not in GPU_METRICS:
        raise ApiError(422, f"unknown metric {metric!r}; expected one of {list(GPU_METRICS)}", loc=["query", "metric"], type="unknown_metric")
    now = time.time()
    until = now if until is None else until
    since = until - 3600 if since is None else since
    if since > until:
        raise ApiError(422, "since is after until", loc=["query", "since"], type="bad_range")
    gpu = queries.gpu_by_uuid(conn, uuid=uuid)
    if gpu is None:
        raise ApiError(404, f"unknown GPU {uuid!r}", loc=["path", "uuid"], type="not_found")
    if resolution == "auto":
        resolution = "raw" if until - since <= RAW_RANGE_S and _raw_covers(conn, gpu["id"], since, now - raw_retention_s) else "1m"
    if resolution == "raw":
        columns = ["ts", "value"]
        points = queries.gpu_series(conn, gpu_id=gpu["id"], metric=metric, since=since, until=until, limit=limit)
    else:
        columns, points = rollups.minute_series(conn, rollups.GPU, series_id=gpu["id"], reading=metric, first=math.ceil(since / 60),
                                                end=math.floor(until / 60) + 1, limit=limit)
    return {
        "uuid": uuid,
        "node": gpu["node"],
        "cluster": gpu["cluster"],
        "index": gpu["index"],
        "metric": metric,
        "since": since,
        "until": until,
        "resolution": resolution,
        "columns": columns,
        "points": [list(point) for point in points],
    }


def _raw_covers(conn, gpu_id: int, since: float, horizon: float) -> bool:
    """Whether raw samples reach back to `since`: within the raw horizon, or not yet deleted."""
    if since >= horizon:
        return True
    oldest = queries.oldest_gpu_sample_ts(conn, gpu_id=gpu_id)
    return oldest is not None and oldest <= since


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
