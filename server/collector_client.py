"""What the CLI commands that talk to a running collector share (laggard stragglers, hints, ack,
k8s-sync, slurm-sync): its URL and the token. It sits below the domains' commands, which import it."""

from __future__ import annotations

import argparse
import os

import httpx


def add_server_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--server", default=os.environ.get("LAGGARD_SERVER", "http://127.0.0.1:8080"), help="collector URL (LAGGARD_SERVER)")
    p.add_argument("--token", default=None,
                   help="bearer token with the read scope (LAGGARD_TOKEN, or a file named by LAGGARD_TOKEN_FILE)")


def auth_headers(token: str | None) -> dict[str, str]:
    """The Authorization header for --token, else LAGGARD_TOKEN, else the file LAGGARD_TOKEN_FILE."""
    token = token or os.environ.get("LAGGARD_TOKEN")
    if not token and (path := os.environ.get("LAGGARD_TOKEN_FILE")):
        with open(path) as f:
            token = f.read().strip()
    return {"Authorization": f"Bearer {token}"} if token else {}


class CollectorUnavailable(RuntimeError):
    """The collector could not be reached, or did not answer as expected (the message says which)."""


def call_collector(method: str, server: str, path: str, *, token: str | None, expect: int, timeout: float, **kwargs) -> httpx.Response:
    """One request to the collector; CollectorUnavailable unless it answers `expect`."""
    try:
        resp = httpx.request(method, f"{server.rstrip('/')}{path}", headers=auth_headers(token), timeout=timeout, **kwargs)
    except httpx.HTTPError as exc:
        raise CollectorUnavailable(f"cannot reach {server}: {exc}") from exc
    if resp.status_code != expect:
        raise CollectorUnavailable(f"{resp.status_code} from {server}: {resp.text[:500]}")
    return resp
