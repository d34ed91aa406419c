"""PostgreSQL goes away under a running collector (through a proxy the test cuts): ingest
answers 503 with Retry-After at once instead of hanging, readiness says so, liveness does not
(a restart would not help), nothing acknowledged is lost, and ingest resumes when the
database is back, without restarting the collector."""

from __future__ import annotations

import time

import httpx

from server.app import create_app
from server.serve import start_in_thread
from server.settings import Settings
from tests.reliability.collector import sample_keys, stored_gpu_samples
from tests.reliability.tcp_proxy import TcpProxy
from tests.server.payloads import batch, encode

# Far below the agents' own request timeout: an answer, not a hang.
ANSWER_WITHIN_S = 15


def post(client: httpx.Client, body: dict) -> httpx.Response:
    content, headers = encode(body, gzipped=True)
    return client.post("/api/v1/samples", content=content, headers=headers)


def test_ingest_answers_503_while_the_database_is_down_and_recovers(postgres_url):
    proxy = TcpProxy(("127.0.0.1", 5432))
    through_proxy = postgres_url.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}")
    assert through_proxy != postgres_url, "the test database URL does not name 127.0.0.1:5432"
    settings = Settings(database_url=through_proxy, detection_enabled=False, retention_interval_s=3600)
    server = start_in_thread(create_app(settings))
    t0 = time.time() - 600
    acked: list[dict] = []
    try:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            for k in range(3):
                body = batch(node="n1", samples=2, ts=t0 + 10 * k)
                assert post(client, body).status_code == 200
                acked.append(body)

            proxy.down()
            answers = []
            for k in range(3, 6):
                started = time.monotonic()
                r = post(client, batch(node="n1", samples=2, ts=t0 + 10 * k))
                answers.append((r.status_code, time.monotonic() - started, r))
            assert [a[0] for a in answers] == [503] * 3, [a[2].text for a in answers]
            assert all(a[1] < ANSWER_WITHIN_S for a in answers), [a[1] for a in answers]
            detail = answers[0][2].json()["detail"][0]
            assert detail["loc"] == ["database"] and answers[0][2].headers["retry-after"]
            assert client.get("/readyz").status_code == 503
            assert client.get("/healthz").status_code == 200

            proxy.up()
            deadline = time.monotonic() + 60
            k = 6
            while time.monotonic() < deadline:  # the agent's retry, until the pool reconnects
                body = batch(node="n1", samples=2, ts=t0 + 10 * k)
                if post(client, body).status_code == 200:
                    acked.append(body)
                    break
                time.sleep(0.5)
            assert len(acked) == 4, "ingest did not resume after the database came back"
            assert client.get("/readyz").status_code == 200
    finally:
        server.stop()
        proxy.down()
    stored = stored_gpu_samples(postgres_url)
    assert sample_keys(acked) <= stored
