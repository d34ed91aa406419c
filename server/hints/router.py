"""Scheduler hints: what a scheduler should do with each node and GPU (docs/rebalancing.md)."""

from __future__ import annotations

import asyncio
from typing import Annotated

import orjson
from fastapi import APIRouter, Depends, Request
from fastapi.responses import PlainTextResponse, Response

from server.compression import MIN_BYTES, accepts_gzip, gzip_bytes
from server.errors import ApiError
from server.hints.render import slurm_lines
from server.hints.service import HintsCache, Snapshot
from server.hints.settings import HintSettings
from server.services import ServicesDep

router = APIRouter(prefix="/api/v1/hints", tags=["hints"])


# The pieces of the app's services (server/services.py) the hints routers use.
async def _hints_cache(services: ServicesDep) -> HintsCache:
    return services.hints


async def _hint_settings(services: ServicesDep) -> HintSettings:
    return services.settings.hints


# The app's hints cache, made in its lifespan (server/app.py) with the engine.
HintsCacheDep = Annotated[HintsCache, Depends(_hints_cache)]
HintSettingsDep = Annotated[HintSettings, Depends(_hint_settings)]


async def snapshot(cache: HintsCache, cluster: str | None) -> Snapshot:
    try:
        # A fresh snapshot is answered on the event loop; otherwise get() (on a worker thread)
        # serves a tolerably stale one at once, or computes when the cache is cold.
        entry = cache.peek(cluster)
        return entry if entry is not None else await asyncio.to_thread(cache.get, cluster)
    except Exception as exc:
        raise ApiError(503, f"hints unavailable: {type(exc).__name__}", type="unavailable", headers={"Retry-After": "5"}) from exc


@router.get("", summary="Per node and GPU: ok / rebalance / avoid / drain, and capacity 0-1 (docs/rebalancing.md)",
            response_class=Response, responses={200: {"content": {"application/json": {}}}, 503: {}})
async def hints(
    request: Request,
    cache: HintsCacheDep,
    cluster: str | None = None,
    node: str | None = None,
    problems_only: bool = False,
) -> Response:
    snap = await snapshot(cache, cluster)
    if node is not None:
        return Response(_encode(snap.doc, node, problems_only), media_type="application/json")
    # The whole document of 100,000 GPUs takes longer to encode than to send: once per snapshot,
    # and gzipped (7.8 MB of JSON) once per snapshot for the clients that ask, off the event loop.
    body = snap.memo(("json", problems_only), _JSON[problems_only])
    if len(body) < MIN_BYTES or not accepts_gzip(request.headers.get("accept-encoding")):
        return Response(body, media_type="application/json", headers={"Vary": "Accept-Encoding"})
    zipped = await asyncio.to_thread(snap.memo, ("json.gz", problems_only), _GZIPPED[problems_only])
    return Response(zipped, media_type="application/json", headers={"Vary": "Accept-Encoding", "Content-Encoding": "gzip"})


# What a snapshot's whole document is sent as (Snapshot.memo), by problems_only.
_JSON = {p: (lambda snap, p=p: _encode(snap.doc, None, p)) for p in (False, True)}
_GZIPPED = {p: (lambda snap, p=p: gzip_bytes(snap.memo(("json", p), _JSON[p]))) for p in (False, True)}


def _encode(doc: dict, node: str | None, problems_only: bool) -> bytes:
    nodes = doc["nodes"]
    if node is not None:
        nodes = [n for n in nodes if n["node"] == node]
    if problems_only:
        nodes = [n for n in nodes if n["action"] != "ok"]
    # Serialised directly: thousands of GPU entries through FastAPI's generic encoder would cost
    # more than computing the hints.
    return orjson.dumps({**doc, "nodes": nodes})


@router.get("/slurm", summary="Plain text for NHC-style health scripts: `node action reason`, one line per node not ok",
            response_class=PlainTextResponse, responses={503: {}})
async def slurm(cache: HintsCacheDep, cluster: str | None = None) -> PlainTextResponse:
    doc = (await snapshot(cache, cluster)).doc
    return PlainTextResponse("".join(line + "\n" for line in slurm_lines(doc)))
