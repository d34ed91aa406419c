"""The status page at /ui: fleet, straggler episode, node; read-only, server-rendered HTML with
SVG charts, its stylesheet, script and icon served from the package (no CDN: air-gapped
clusters). Mounted by the app with no scope of its own (server/app.py): the page checks the
read scope itself (server/ui/auth.py) so that it can answer a browser with the login form
instead of a JSON 401, and take the token from its session cookie as well as from a header.

  GET  /ui                      the fleet (?cluster= one cluster)
  GET  /ui/episodes/{id}        one straggler episode: summary, chart against its peers, timeline, evidence
  GET  /ui/nodes/{node}         one node (?cluster= when the name is in several): GPUs, ports, hint, what Slurm/Kubernetes are told
  GET  /ui/stragglers           ?cluster=&node=&gpu=: the one active episode there (303), else the list
  GET  /ui/login, POST /ui/login, POST /ui/logout
  GET  /ui/static/{name}        ui.css, ui.js, icon.svg
Every view takes ?refresh=<seconds> (default 10; 0: no live refresh)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response

from server.errors import ApiError
from server.hints.k8s_sync import utc_now
from server.hints.service import HintsCache
from server.peer_groups import peer_group
from server.services import ServicesDep, services
from server.store import episodes as episode_store
from server.store import queries
from server.ui import auth, data, pages, series, views
from server.ui.html import Links, a, page

router = APIRouter(prefix="/ui", include_in_schema=False)

DEFAULT_REFRESH = 10
STATIC_DIR = Path(__file__).with_name("static")
_MEDIA_TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".svg": "image/svg+xml"}
_FILES = {p.name: p for p in STATIC_DIR.iterdir() if p.suffix in _MEDIA_TYPES}
# Nothing but this collector: the browser itself refuses anything off-host, inline scripts and inline styles.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; "
       "frame-ancestors 'none'; base-uri 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin",
           "Cache-Control": "no-store", "X-Frame-Options": "DENY"}
Refresh = Query(DEFAULT_REFRESH, ge=0, le=3600, description="seconds between live refreshes; 0: none")


def _prefix(request: Request) -> str:
    """Where the app is mounted (a reverse proxy's root_path), as in server/api/docs.py."""
    return request.scope.get("root_path", "").rstrip("/")


def _html(body: str, status: int = 200, headers: dict[str, str] | None = None) -> HTMLResponse:
    return HTMLResponse(body, status_code=status, headers={**HEADERS, **(headers or {})})


def _page(request: Request, title: str, body: str, *, refresh: int = 0, status: int = 200, headers: dict[str, str] | None = None) -> HTMLResponse:
    insecure = services(request).settings.auth.insecure
    notice = "Authentication is off (--insecure): anyone who reaches this collector sees this page." if insecure else ""
    signed_in = not insecure and bool(request.cookies.get(auth.COOKIE))
    return _html(page(title, body, Links(_prefix(request)), refresh=refresh, signed_in=signed_in, notice=notice), status, headers)


async def _gate(request: Request) -> Response | None:
    """None when the request may see the page; else the answer: the login form for a browser
    without a usable session, an error page otherwise."""
    prefix, header = _prefix(request), auth.bearer(request)
    try:
        await auth.principal_of(request, header or request.cookies.get(auth.COOKIE))
        return None
    except ApiError as exc:
        if exc.status == 401 and header is None:
            return auth.to_login(request, prefix)
        return _refusal(request, exc)


def _refusal(request: Request, exc: ApiError) -> HTMLResponse:
    msg = exc.detail[0]["msg"]
    titles = {401: "Not signed in", 403: "Not allowed", 429: "Slow down", 503: "Unavailable"}
    body = pages.message(titles.get(exc.status, "Error"), msg, Links(_prefix(request)), login_link=exc.status in (401, 403))
    return _page(request, titles.get(exc.status, "Error"), body, status=exc.status, headers=exc.headers)


async def _hints(cache: HintsCache, cluster: str | None) -> dict[str, Any] | None:
    """The hints document (the cache GET /api/v1/hints serves), or None if it cannot be had."""
    try:
        entry = cache.peek(cluster)
        return (entry if entry is not None else await asyncio.to_thread(cache.get, cluster)).doc
    except Exception:
        return None


def _read(engine, query, **kwargs: Any) -> Any:
    """One storage query on a connection of its own (call on a worker thread)."""
    with engine.connect() as conn:
        return query(conn, **kwargs)


# --- views ----------------------------------------------------------------------------------


@router.api_route("", methods=["GET", "HEAD"])
async def fleet(request: Request, svc: ServicesDep, cluster: str | None = None, refresh: int = Refresh) -> Response:
    if (denied := await _gate(request)) is not None:
        return denied
    hints = await _hints(svc.hints, cluster)
    drop = svc.settings.detection.clock_drop
    vm = await asyncio.to_thread(_fleet_model, svc.engine, cluster, hints, drop)
    title = f"Fleet · {cluster}" if cluster else "Fleet"
    return _page(request, title, pages.fleet(vm, Links(_prefix(request))), refresh=refresh)


def _fleet_model(engine, cluster: str | None, hints: dict[str, Any] | None, drop: float) -> dict[str, Any]:
    with engine.connect() as conn:
        nodes = data.nodes(conn, cluster=cluster)
        gpus = data.grid_gpus(conn, cluster=cluster)
        active = episode_store.active_episodes(conn, cluster=cluster)
    return {**views.fleet_view(nodes, gpus, active, hints, clock_drop=drop), "cluster": cluster}


@router.api_route("/episodes/{episode_id}", methods=["GET", "HEAD"])
async def episode(request: Request, svc: ServicesDep, episode_id: int, refresh: int = Refresh) -> Response:
    if (denied := await _gate(request)) is not None:
        return denied
    vm = await asyncio.to_thread(_episode_model, svc.engine, episode_id)
    links = Links(_prefix(request))
    if vm is None:
        return _page(request, "No such episode", pages.message("No such episode", f"episode {episode_id} is not stored "
                                                                "(never, or deleted by retention)", links), status=404)
    hints = await _hints(svc.hints, vm["episode"]["cluster"])
    vm["hint"] = views.hint_index(hints)[0].get((vm["episode"]["cluster"], vm["episode"]["node"]))
    ep = vm["episode"]
    return _page(request, f"#{ep['id']} {ep['cause']} {ep['node']}", pages.episode(vm, links), refresh=refresh)


def _episode_model(engine, episode_id: int) -> dict[str, Any] | None:
    with engine.connect() as conn:
        ep = data.episode(conn, episode_id=episode_id)
        if ep is None:
            return None
        now = data.cluster_now(conn, cluster=ep["cluster"]) or ep["detected_at"]
        since, until = series.episode_window(ep["onset"], ep["resolved_at"], now)
        node = data.node_record(conn, cluster=ep["cluster"], node=ep["node"])
        nic = ep.get("gpu") is None
        target, peers = (data.nic_peers if nic else data.gpu_peers)(conn, ep=ep)
        metrics = [m for m in series.charts_for(ep["cause"], ep.get("evidence")) if m.nic == nic]
        rows: dict[int, list[dict[str, Any]]] = {}
        if target is not None and metrics:
            columns = sorted({c for m in metrics for c in m.columns})
            rows = data.samples(conn, ids=[target["id"], *(p["id"] for p in peers)], columns=columns, since=since, until=until, nic=nic)
        events = data.episode_events(conn, episode_id=episode_id)
    label = _target_label(ep, target)
    charts = [series.build_chart(m, ep, rows[target["id"]], {p["id"]: rows[p["id"]] for p in peers}, since=since, until=until,
                                 target_label=label) for m in metrics if target is not None]
    evidence = ep.get("evidence") or {}
    group = peer_group(cluster=ep["cluster"], model=target.get("model"), labels=target["labels"]) if target and not nic else None
    return {"episode": ep, "charts": charts, "events": events, "now": now, "labels": (node or {}).get("labels") or {},
            "peer_group": group or (f"{ep['cluster']} ports of the same job/partition" if nic and target else None),
            "peer_count": len(peers), "workload": _workload_facts(evidence),
            "no_chart": None if charts else "no samples of this GPU or port are stored for this episode's window"}


def _workload_facts(evidence: dict[str, Any]) -> dict[str, Any] | None:
    """What the detector says the GPU was running (evidence.workload, evidence.job: issue #15)."""
    workload = evidence.get("workload")
    if isinstance(workload, dict):
        return workload
    if isinstance(workload, str):
        return {"workload": workload} | ({"attributed job": evidence["job"]} if evidence.get("job") else {})
    return None


def _target_label(ep: dict[str, Any], target: dict[str, Any] | None) -> str:
    if target is None:
        return "this GPU"
    if "device" in target:
        return f"{target['node']} {target['device']} port {target['port']}"
    return f"{ep['node']} GPU {ep['gpu']}"


@router.api_route("/nodes/{node}", methods=["GET", "HEAD"])
async def node(request: Request, svc: ServicesDep, node: str, cluster: str | None = None, refresh: int = Refresh) -> Response:
    if (denied := await _gate(request)) is not None:
        return denied
    links = Links(_prefix(request))
    found = await asyncio.to_thread(_read, svc.engine, queries.find_nodes, name=node, cluster=cluster)
    if len(found) != 1:
        text = (f"node {node!r} is in clusters {', '.join(sorted(n['cluster'] for n in found))}: pick one" if found
                else f"no node {node!r} has reported" + (f" in cluster {cluster!r}" if cluster else ""))
        body = pages.message("Which node?" if found else "No such node", text, links)
        body += "".join(f"<p>{a(links.node(n['cluster'], node), n['cluster'] + ' / ' + node)}</p>" for n in found)
        return _page(request, "Node", body, status=409 if found else 404)
    record = found[0]
    hints = await _hints(svc.hints, record["cluster"])
    vm = await asyncio.to_thread(_node_model, svc.engine, record, hints, svc.settings.hints)
    return _page(request, f"{record['node']}", pages.node(vm, links), refresh=refresh)


def _node_model(engine, record: dict[str, Any], hints: dict[str, Any] | None, cfg) -> dict[str, Any]:
    with engine.connect() as conn:
        gpus = queries.node_gpus_latest(conn, node_id=record["id"])
        nics = queries.node_nics_latest(conn, node_id=record["id"])
        now = data.cluster_now(conn, cluster=record["cluster"]) or record["last_seen"]
        eps = data.node_episodes(conn, cluster=record["cluster"], node=record["node"], since=now - 86400)
    hint = views.hint_index(hints)[0].get((record["cluster"], record["node"])) if hints is not None else None
    return {"node": record, "hint": hint, "gpus": views.gpu_rows(gpus, hint), "nics": nics, "episodes": eps, "now": now,
            "slurm": views.slurm_says(record["node"], hint, cfg), "kubernetes": views.kubernetes_says(record["node"], hint, cfg, now=utc_now())}


@router.api_route("/stragglers", methods=["GET", "HEAD"])
async def stragglers(request: Request, svc: ServicesDep, cluster: str | None = None, node: str | None = None,
                     gpu: int | None = None) -> Response:
    """The query of an alert's generatorURL (cluster, node; gpu): its episode's page if one is
    active there, else the active ones that match."""
    if (denied := await _gate(request)) is not None:
        return denied
    links = Links(_prefix(request))
    active = await asyncio.to_thread(_read, svc.engine, episode_store.active_episodes, cluster=cluster, node=node)
    found = [x for x in active if gpu is None or x.get("gpu") == gpu]
    if len(found) == 1:
        return RedirectResponse(links.episode(found[0]["id"]), status_code=303)
    body = "<h1>Stragglers</h1>" + pages.episode_table(views.sorted_episodes(found), links)
    if node and cluster:
        body += f"<p>{a(links.node(cluster, node), 'the node ' + node)}</p>"
    return _page(request, "Stragglers", body)


# --- session --------------------------------------------------------------------------------


@router.get("/login")
async def login_form(request: Request, next: str | None = None) -> Response:
    prefix = _prefix(request)
    header, cookie = auth.bearer(request), request.cookies.get(auth.COOKIE)
    if header or cookie or services(request).settings.auth.insecure:
        try:
            await auth.principal_of(request, header or cookie)
            return RedirectResponse(auth.safe_next(next, prefix), status_code=303)
        except ApiError:
            pass
    return _page(request, "Sign in", pages.login(Links(prefix), next_url=auth.safe_next(next, prefix)))


@router.post("/login")
async def login(request: Request) -> Response:
    prefix = _prefix(request)
    token, next_url = await auth.form_token(request)
    try:
        await auth.principal_of(request, token)
    except ApiError as exc:
        why = {401: "Unknown or revoked token.", 403: "This token lacks the read scope: an agent or scheduler token cannot open the page."}
        body = pages.login(Links(prefix), next_url=auth.safe_next(next_url, prefix), error=why.get(exc.status, exc.detail[0]["msg"]))
        return _page(request, "Sign in", body, status=exc.status, headers={k: v for k, v in (exc.headers or {}).items() if k == "Retry-After"})
    response = RedirectResponse(auth.safe_next(next_url, prefix), status_code=303)
    if token and not services(request).settings.auth.insecure:
        auth.set_session(response, request, token, prefix)
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    prefix = _prefix(request)
    response = RedirectResponse(f"{prefix}/ui/login", status_code=303)
    auth.end_session(response, prefix)
    return response


@router.api_route("/static/{name}", methods=["GET", "HEAD"])
def static(name: str) -> FileResponse:
    path = _FILES.get(name)
    if path is None:
        raise ApiError(404, f"no file {name!r}", loc=["path", "name"], type="not_found")
    return FileResponse(path, media_type=_MEDIA_TYPES[path.suffix], headers={"Cache-Control": "public, max-age=3600",
                                                                             "X-Content-Type-Options": "nosniff"})
