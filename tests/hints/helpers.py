"""Shared pieces of the hints tests: a collector on a real database, fleet samples pushed over
HTTP (they make the inventory and move the cluster's sample clock), episodes written straight
through the store (detector off) when a test needs exact control over them, and a tiny HTTP
server that serves a fixed hints document to the sync commands."""

from __future__ import annotations

import contextlib
import json
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

import httpx

from server.app import create_app
from server.detect.settings import DetectionSettings
from server.hints.settings import HintSettings
from server.serve import start_in_thread
from server.settings import Settings
from server.store import episodes
from server.store.engine import make_engine
from tests.hints.loopback import LoopbackServer

T0 = float(int(time.time()) - 3600)  # recent: retention (7 days) keeps it


def settings_for(database_url: str, *, detect: bool = False, **hints: Any) -> Settings:
    cfg = {"cache_ttl_s": 0.0, "max_stale_s": 0.0, **hints}  # every request sees what is stored now
    return Settings(database_url=database_url, detection_enabled=detect, detection=DetectionSettings(open_after_s=0, clear_after_s=0),
                    detection_poll_s=0.05, hints=HintSettings(**cfg))


@contextlib.contextmanager
def collector(settings: Settings):
    server = start_in_thread(create_app(settings))
    engine = make_engine(settings.database_url)
    try:
        yield server, engine
    finally:
        engine.dispose()
        server.stop()


def uuid_of(node: str, index: int, cluster: str = "prod") -> str:
    # A UUID names one physical GPU: a node of the same name in another cluster has others.
    return f"GPU-{node}-{index}" if cluster == "prod" else f"GPU-{cluster}-{node}-{index}"


def gpu(node: str, index: int, ts: float, *, cluster: str = "prod", **override: Any) -> dict[str, Any]:
    base = {
        "index": index, "uuid": uuid_of(node, index, cluster), "model": "NVIDIA H100 80GB HBM3", "temp_c": 64.0 + index * 0.3,
        "power_w": 600.0, "power_limit_w": 700.0, "sm_clock_mhz": 1980 - index, "sm_clock_max_mhz": 1980,
        "mem_clock_mhz": 2619, "mem_clock_max_mhz": 2619, "util_gpu_pct": 99.0, "util_mem_pct": 40.0,
        "clocks_event_reasons": 0x4, "pcie_gen": 5, "pcie_gen_max": 5, "pcie_width": 16, "pcie_width_max": 16,
        "pcie_replay_total": 0, "nvlink_links_up": 18, "nvlink_links_total": 18,
        "nvlink_tx_bytes_total": int((ts - T0 + 1) * 5e10), "nvlink_rx_bytes_total": int((ts - T0 + 1) * 5e10),
        "nvlink_crc_errors_total": 0, "nvlink_replay_errors_total": 0, "nvlink_recovery_errors_total": 0,
        "ecc_corrected_total": 0, "ecc_uncorrected_total": 0, "remapped_rows_pending": False,
    }
    return base | override


HOT = {"temp_c": 91.0, "sm_clock_mhz": 1400, "clocks_event_reasons": 0x40}  # HW thermal slowdown


def body(node: str, ts: float, *, cluster: str = "prod", gpus: int = 8, faults: dict[int, dict] | None = None) -> dict[str, Any]:
    faults = faults or {}
    return {"version": 1, "node": node, "cluster": cluster, "labels": {"job": "llm"},
            "samples": [{"ts": ts, "gpus": [gpu(node, i, ts, cluster=cluster, **faults.get(i, {})) for i in range(gpus)], "nics": []}]}


def push(url: str, payload: dict[str, Any]) -> None:
    r = httpx.post(f"{url}/api/v1/samples", json=payload, timeout=30)
    assert r.status_code == 200, r.text


def push_fleet(url: str, nodes: list[str], start: int, stop: int, *, cluster: str = "prod",
               faults: dict[str, dict[int, dict]] | None = None) -> None:
    for k in range(start, stop):
        for node in nodes:
            push(url, body(node, T0 + k, cluster=cluster, faults=(faults or {}).get(node)))


def open_episode(engine, *, node: str, gpu: int | None, cause: str, severity: str, onset: float, cluster: str = "prod",
                 evidence: dict[str, Any] | None = None, summary: str | None = None, resolved_at: float | None = None) -> int:
    with engine.begin() as conn:
        ep = episodes.open_episode(
            conn, cluster=cluster, node=node, gpu=gpu, uuid=None if gpu is None else uuid_of(node, gpu, cluster),
            entity=f"{cluster}/{node}/{gpu}/{cause}", cause=cause, severity=severity, onset=onset, detected_at=onset,
            evidence=evidence or {}, summary=summary or f"GPU {gpu} {cause}",
        )
        if resolved_at is not None:
            episodes.resolve_episode(conn, episode_id=ep, resolved_at=resolved_at)
    return ep


def resolve(engine, episode_id: int, resolved_at: float) -> None:
    with engine.begin() as conn:
        episodes.resolve_episode(conn, episode_id=episode_id, resolved_at=resolved_at)


def get_hints(url: str, **params: Any) -> dict[str, Any]:
    r = httpx.get(f"{url}/api/v1/hints", params=params, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def node_of(doc: dict[str, Any], name: str, cluster: str | None = None) -> dict[str, Any]:
    return next(n for n in doc["nodes"] if n["node"] == name and (cluster is None or n["cluster"] == cluster))


def hint_doc(*nodes: tuple[str, str, float, list[tuple[str, str]]]) -> dict[str, Any]:
    """A hints document by hand: (node, action, capacity, [(cause, summary), ...])."""
    return {"generated_at": time.time(), "sample_time": {"prod": T0}, "nodes": [
        {"node": name, "cluster": "prod", "action": action, "capacity": capacity, "since": None if action == "ok" else T0,
         "reasons": [{"episode": i + 1, "gpu": 0, "cause": c, "severity": "critical", "action": action, "capacity": capacity,
                      "summary": s, "onset": T0, "resolved_at": None, "clears_at": None} for i, (c, s) in enumerate(reasons)],
         "gpus": []}
        for name, action, capacity, reasons in nodes]}


class HintsServer(LoopbackServer):
    """Serves a hints document (changeable) on GET /api/v1/hints, records the query strings."""

    def __init__(self, doc: dict[str, Any]):
        self.doc = doc
        self.queries: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                outer.queries.append(self.path)
                data = json.dumps(outer.doc).encode()
                self.send_response(200 if self.path.startswith("/api/v1/hints") else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._serve(Handler)
