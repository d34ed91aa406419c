"""POST /api/v1/samples: the agents' way in (protocol v1, docs/protocol.md)."""

from __future__ import annotations

import asyncio
import functools
import time
from typing import Any

from fastapi import APIRouter, Request, Response

from server.errors import ApiError
from server.ingest.decode import content_is_gzip, decode_rows, read_body
from server.services import services
from server.store.engine import database_unavailable, disk_full
from server.store.ids import GpuClaimConflict
from server.store.writer_service import WriterDiskFull, WriterUnavailable

router = APIRouter(prefix="/api/v1", tags=["ingest"])


@router.post(
    "/samples",
    summary="Push a batch of samples from one node",
    response_model=dict[str, int],
    responses={400: {}, 408: {}, 409: {}, 413: {}, 415: {}, 422: {}, 429: {}, 503: {}, 507: {}},
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Batch"}}}}},
)
async def post_samples(request: Request) -> Response:
    # The collector's hot path: the app's services come straight from the app state (one
    # attribute read, no dependency solving; a plain-def dependency would even cost two thread
    # hand-offs), and the answer is rendered here rather than validated and serialised by FastAPI.
    # Limits by work (server/ingest/admission.py): in-flight requests and rows, per token and cluster.
    svc = services(request)
    with svc.admission.request(request.state.principal):
        return await _ingest(request, svc)


async def _ingest(request: Request, svc: Any) -> Response:  # svc: server/app.py Services
    cfg = svc.settings.ingest
    writer = svc.writer
    gzipped = content_is_gzip(request.headers.get("content-encoding"))
    raw = await read_body(request.stream(), content_length=request.headers.get("content-length"), limit=cfg.max_body_bytes)
    decode = functools.partial(
        decode_rows, raw, gzipped=gzipped, limit=cfg.max_body_bytes, now=time.time(), max_future_skew_s=cfg.max_future_skew_s,
        principal=request.state.principal,  # set by the router's auth dependency (server/auth/guard.py)
    )
    health = svc.write_health
    try:
        job = svc.admission.job(decode, request.state.principal, raw=raw, gzipped=gzipped)
        accepted = await asyncio.wrap_future(writer.submit(*job))
    except ApiError:
        raise
    except GpuClaimConflict as conflict:
        raise ApiError(409, str(conflict), loc=["body", "samples", "gpus", "uuid"], type="gpu_conflict") from None
    except Exception as exc:
        # Nothing was committed: the agent keeps the batch and retries later.
        if isinstance(exc, WriterDiskFull) or disk_full(exc):
            health.failed("disk full")
            raise ApiError(507, "disk full: the database has no space left; nothing was stored", loc=["database"], type="disk_full",
                           headers={"Retry-After": "30"}) from exc
        if _database_unavailable(exc):
            health.failed(f"database unavailable: {type(exc).__name__}")
            raise ApiError(503, f"database unavailable: {type(exc).__name__}", loc=["database"], type="unavailable",
                           headers={"Retry-After": "5"}) from exc
        raise
    health.succeeded()
    return Response(b'{"accepted":%d}' % accepted, media_type="application/json")


def _database_unavailable(exc: Exception) -> bool:
    return isinstance(exc, WriterUnavailable) or database_unavailable(exc)
