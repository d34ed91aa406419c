"""`laggard-agent --metrics-port`: GET /healthz, the DaemonSet's liveness and readiness probe
(deploy/kubernetes/agent.yaml). It fails once the sampling loop stops producing samples."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from agent.cli import healthz_stale_after
from agent.metrics import MetricsServer, NodeMetrics
from agent.sample import Sample
from tests.metrics.tools import free_port

REPO = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_health_follows_the_age_of_the_latest_sample():
    clock = Clock()
    metrics = NodeMetrics(None, node="n1", cluster="c", stale_after=60.0, clock=clock)
    clock.now += 59.0  # the start counts as a sample: the first read may be slow
    assert metrics.health()[0] is True
    clock.now += 2.0
    healthy, details = metrics.health()
    assert healthy is False and details["status"] == "stale" and details["samples"] == 0
    metrics.submit(Sample(ts=1.0, gpus=[], nics=[]))
    healthy, details = metrics.health()
    assert healthy is True and details == {"status": "ok", "samples": 1, "seconds_since_last_sample": 0.0, "stale_after_s": 60.0}


def test_no_limit_means_always_healthy():
    clock = Clock()
    metrics = NodeMetrics(None, node="n1", cluster="c", clock=clock)
    clock.now += 1e6
    assert metrics.health()[0] is True


def test_stale_after_is_several_intervals_and_at_least_a_minute():
    assert healthz_stale_after(5.0) == 60.0
    assert healthz_stale_after(30.0) == 180.0


def test_healthz_over_http_turns_503_when_sampling_stalls():
    clock = Clock()
    metrics = NodeMetrics(None, node="n1", cluster="c", stale_after=10.0, clock=clock)
    server = MetricsServer(metrics, "127.0.0.1", 0).start()
    try:
        url = f"http://127.0.0.1:{server.port}/healthz"
        ok = httpx.get(url, timeout=5)
        assert ok.status_code == 200 and ok.headers["content-type"] == "application/json"
        assert ok.json()["status"] == "ok"
        clock.now += 11.0
        stale = httpx.get(url, timeout=5)
        assert stale.status_code == 503 and stale.json()["status"] == "stale"
        assert stale.json()["seconds_since_last_sample"] == 11.0
        assert httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=5).status_code == 200
    finally:
        server.close()


def test_a_running_agent_answers_healthz():
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent.cli", "--simulate", "H100:1", "--interval", "0.5", "--node", "sim-1",
         "--collector", f"http://127.0.0.1:{free_port()}", "--metrics-port", f"127.0.0.1:{port}"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=os.environ | {"PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline, body = time.monotonic() + 30, None
        while time.monotonic() < deadline:
            try:
                reply = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
            except httpx.HTTPError:
                time.sleep(0.2)
                continue
            body = reply.json()
            if body["samples"] >= 2:
                break
            time.sleep(0.2)
        assert reply.status_code == 200 and body["status"] == "ok" and body["samples"] >= 2
        assert body["stale_after_s"] == 60.0
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert "Traceback" not in out, out[-3000:]
