"""Helpers shared by the observability tests (metrics, alerts, dashboards): the Debian
prometheus / prometheus-alertmanager binaries, free ports, a local HTTP receiver, parsing."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families


def require_binary(name: str) -> str:
    """The binary's path. Missing: a failure under CI (.ci/run installs it), a skip locally."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} not installed (Debian packages prometheus, prometheus-alertmanager; .ci/run installs them)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 30.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} did not answer within {timeout} s")
        time.sleep(0.1)


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """Exposition text → {(sample name, frozenset(labels.items())): value}."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def values(text: str, name: str, **labels: str) -> list[float]:
    want = set(labels.items())
    return [v for (n, ls), v in samples(text).items() if n == name and want <= set(ls)]


def promtool_check_metrics(text: str) -> tuple[int, list[str]]:
    promtool = require_binary("promtool")
    proc = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    problems = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    return proc.returncode, problems


class Receiver:
    """A local HTTP server that records what is POSTed to it; `fail_next` requests get 500."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.fail_next = 0
        self.status = 200
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with outer.lock:
                    status = outer.status
                    if outer.fail_next > 0:
                        outer.fail_next -= 1
                        status = 500
                    outer.requests.append({"path": self.path, "headers": dict(self.headers), "body": body,
                                           "failed": not 200 <= status < 300, "at": time.time()})
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def delivered(self) -> list[dict]:
        """Bodies (parsed) of the requests answered 2xx."""
        with self.lock:
            return [json.loads(r["body"]) for r in self.requests if not r["failed"]]

    def wait(self, predicate, timeout: float = 20.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.delivered()
            if predicate(got):
                return got
            time.sleep(0.05)
        return self.delivered()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def stop_agents(stop: threading.Event, agents: list, fleet) -> None:
    """Stop simulated agents (their Runner threads and Pushers, flushing what is queued), then
    their simulated fleet."""
    stop.set()
    for pusher, thread in agents:
        thread.join(10)
        pusher.close(flush_timeout=5)
    fleet.close()
