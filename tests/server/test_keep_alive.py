"""An agent's pushes, ~10 s apart, reuse one connection to the real collector, and the
collector never closes it as the agent reuses it (uvicorn's default 5 s idle timeout did:
"Connection reset by peer", a retry and a warning in every demo)."""

from __future__ import annotations

import time

import httpx
import pytest

from agent.push import KEEPALIVE_EXPIRY_S, Pusher
from agent.sample import GpuSample, Sample
from server.app import create_app
from server.serve import KEEP_ALIVE_S, start_in_thread
from server.settings import Settings

IDLE_S = 6.0  # longer than uvicorn's default keep-alive (5 s), well under ours


@pytest.fixture
def collector(sqlite_url):
    running = start_in_thread(create_app(Settings(database_url=sqlite_url, insecure=True)))
    yield running
    running.stop()


def test_the_collector_keeps_idle_connections_longer_than_agents_do():
    assert KEEPALIVE_EXPIRY_S < KEEP_ALIVE_S


def test_pushes_apart_reuse_one_connection(collector):
    pusher = Pusher(collector.url, node="n1", batch_size=1)
    client_ports: list[int] = []

    def remember_port(response: httpx.Response) -> None:
        client_ports.append(response.extensions["network_stream"].get_extra_info("client_addr")[1])

    pusher._client.event_hooks["response"].append(remember_port)
    try:
        for i in range(2):
            if i:
                time.sleep(IDLE_S)
            pusher.queue.put(Sample(ts=time.time(), gpus=[GpuSample(index=0, uuid="GPU-keepalive")], nics=[]))
            assert pusher.send_once() is None
    finally:
        pusher.close(flush_timeout=0)
    assert pusher.stats.sent_samples == 2 and pusher.stats.failed_attempts == 0
    assert len(client_ports) == 2 and client_ports[0] == client_ports[1]  # one connection


def test_an_unexpected_error_says_it_closes_the_connection(sqlite_url):
    # uvicorn drops the connection after a 500 (Starlette re-raises the error once answered);
    # without "Connection: close" a keep-alive client sends its next request into a closed
    # socket. No request is known to cause one: a route that fails stands in for a bug.
    app = create_app(Settings(database_url=sqlite_url, insecure=True))

    def broken() -> None:
        raise RuntimeError("a bug")

    app.add_api_route("/broken", broken)
    running = start_in_thread(app, log_level="critical")
    try:
        with httpx.Client(base_url=running.url, timeout=30) as http:
            r = http.get("/broken")
            assert r.status_code == 500
            assert r.headers["connection"] == "close"
            assert r.json()["detail"][0]["type"] == "internal"
            assert http.get("/healthz").status_code == 200  # the client knew to open a new connection
    finally:
        running.stop()
