"""kube-scheduler extender: POST /scheduler/filter and /scheduler/prioritize (server/hints/extender.py
has the protocol). Point a KubeSchedulerConfiguration's extender urlPrefix at
http://<collector>/scheduler (hints.scheduler_cluster picks the cluster) or at
http://<collector>/scheduler/clusters/<cluster> (deploy/kubernetes/scheduler/).

Answers come from the hints cache (a dict lookup per node), so they take milliseconds, well
inside kube-scheduler's default 5 s extender timeout; large NodeLists (nodeCacheCapable: false
sends every Node object) are parsed and serialised off the event loop."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from server.errors import ApiError
from server.hints import extender
from server.hints.router import HintsCacheDep, HintSettingsDep, snapshot
from server.hints.service import HintsCache
from server.hints.settings import HintSettings

log = logging.getLogger(__name__)
router = APIRouter(prefix="/scheduler", tags=["scheduler"])
_OFFLOAD_BYTES = 1 << 20


async def _args(request: Request) -> extender.ExtenderArgs:
    raw = await request.body()
    try:
        body = await asyncio.to_thread(orjson.loads, raw) if len(raw) > _OFFLOAD_BYTES else orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"body is not JSON: {exc}", loc=["body"], type="json_invalid") from exc
    try:
        return extender.decode_args(body)
    except extender.ProtocolError as exc:
        raise ApiError(400, str(exc), loc=exc.loc, type="extender_args") from exc


async def _hints(cache: HintsCache, cluster: str | None) -> tuple[dict[str, Any], str]:
    """Node name → hint, and an error text when hints cannot be had (then every node passes)."""
    try:
        return (await snapshot(cache, cluster)).by_name(), ""
    except ApiError as exc:
        log.warning("scheduler extender answering without hints: %s", exc)
        return {}, f"laggard: {exc}"


async def _unknown_cluster(cache: HintsCache, cluster: str | None, hints: dict[str, Any]) -> str | None:
    """Why a named cluster is unknown (no node of it has ever reported), or None. Answering such a
    request as if every node were healthy would let a typo in urlPrefix turn filtering off unseen."""
    if cluster is None or hints:
        return None
    known = sorted({n["cluster"] for n in (await snapshot(cache, None)).doc["nodes"]})
    if cluster in known:
        return None
    return (f"laggard: unknown cluster {cluster!r}: no node of it has reported (check the extender's urlPrefix "
            f"or hints.scheduler_cluster; known clusters: {', '.join(known) or 'none yet'})")


async def _json(payload: Any, big: bool) -> Response:
    content = await asyncio.to_thread(orjson.dumps, payload) if big else orjson.dumps(payload)
    return Response(content, media_type="application/json")


def _cluster(cfg: HintSettings, cluster: str | None) -> str | None:
    return cluster if cluster is not None else cfg.scheduler_cluster


async def _filter(request: Request, cache: HintsCache, cfg: HintSettings, cluster: str | None) -> Response:
    args = await _args(request)
    name = _cluster(cfg, cluster)
    hints, error = await _hints(cache, name)
    if not error:
        error = await _unknown_cluster(cache, name, hints) or ""
    result = extender.filter_result(args, hints, cfg, error=error)
    return await _json(result, big=args.nodes is not None and len(args.node_items or ()) > 200)


async def _prioritize(request: Request, cache: HintsCache, cfg: HintSettings, cluster: str | None) -> Response:
    args = await _args(request)
    name = _cluster(cfg, cluster)
    hints, _ = await _hints(cache, name)
    if (unknown := await _unknown_cluster(cache, name, hints)) is not None:
        # HostPriorityList has no error field: the scheduler logs a failed prioritize and goes on.
        raise ApiError(404, unknown, loc=["path", "cluster"], type="unknown_cluster")
    return await _json(extender.prioritize_result(args, hints, cfg), big=False)


_FILTER_DOC = dict(summary="Extender filter: ExtenderArgs → ExtenderFilterResult (avoid/drain nodes fail)", responses={400: {}})
_PRIORITIZE_DOC = dict(summary="Extender prioritize: ExtenderArgs → HostPriorityList (score = capacity × 10)", responses={400: {}, 404: {}})


@router.post("/filter", **_FILTER_DOC)
async def filter_nodes(request: Request, cache: HintsCacheDep, cfg: HintSettingsDep) -> Response:
    return await _filter(request, cache, cfg, None)


@router.post("/prioritize", **_PRIORITIZE_DOC)
async def prioritize_nodes(request: Request, cache: HintsCacheDep, cfg: HintSettingsDep) -> Response:
    return await _prioritize(request, cache, cfg, None)


@router.post("/clusters/{cluster}/filter", **_FILTER_DOC)
async def filter_cluster_nodes(cluster: str, request: Request, cache: HintsCacheDep, cfg: HintSettingsDep) -> Response:
    return await _filter(request, cache, cfg, cluster)


@router.post("/clusters/{cluster}/prioritize", **_PRIORITIZE_DOC)
async def prioritize_cluster_nodes(cluster: str, request: Request, cache: HintsCacheDep, cfg: HintSettingsDep) -> Response:
    return await _prioritize(request, cache, cfg, cluster)
