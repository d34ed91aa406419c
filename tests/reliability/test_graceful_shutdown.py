"""SIGTERM during sustained ingest: the collector stops accepting, answers the requests it
already has (200, committed), and exits 0. A client whose keep-alive connection was closed
before its request got through sees a transport error and retries, as the agent does; nobody
gets a 5xx, and every acknowledged sample is stored."""

from __future__ import annotations

import signal
import threading
import time

import httpx
import pytest

from tests.reliability.collector import (
    CollectorProcess,
    sample_keys,
    stored_gpu_samples,
)
from tests.server.payloads import batch, encode

# A collector process under eight clients' large batches, SIGTERMed mid-flight: 10-30 s each.
pytestmark = pytest.mark.slow

CLIENTS = 8
ROUNDS = 12


@pytest.mark.parametrize("workers", [1, 2])
def test_sigterm_finishes_in_flight_requests_and_exits_0(sqlite_url, tmp_path, workers):
    collector = CollectorProcess(sqlite_url, tmp_path, workers=workers, env={"LAGGARD_DETECTION_ENABLED": "false"}).start()
    t0 = time.time() - 3600
    results: list[tuple[float, float, int | str, dict]] = []  # (sent, answered, status, body)
    lock = threading.Lock()
    stop = threading.Event()

    # Large bodies (200 samples x 8 GPUs) keep requests in flight for a while; built up front so
    # that the clients spend their time waiting on the collector, not encoding.
    bodies = {c: [batch(node=f"n{c}", samples=200, gpus=8, ts=t0 + r * 200) for r in range(ROUNDS)] for c in range(CLIENTS)}
    encoded = {c: [encode(b, gzipped=True) for b in bs] for c, bs in bodies.items()}
    sending = threading.Event()  # set as a request starts once the collector is warm: SIGTERM then

    def on_request(_request) -> None:
        if len(results) >= 2 * CLIENTS:
            sending.set()

    def client(c: int) -> None:
        with httpx.Client(base_url=collector.url, timeout=30, event_hooks={"request": [on_request]}) as http:
            for r in range(ROUNDS):
                if stop.is_set():
                    return
                body = bodies[c][r]
                content, headers = encoded[c][r]
                sent = time.monotonic()
                try:
                    status: int | str = http.post("/api/v1/samples", content=content, headers=headers).status_code
                except httpx.TransportError as exc:
                    status = type(exc).__name__
                with lock:
                    results.append((sent, time.monotonic(), status, body))
                if status != 200:
                    return  # shut down: an agent would keep the batch and retry elsewhere or later

    threads = [threading.Thread(target=client, args=(c,)) for c in range(CLIENTS)]
    for t in threads:
        t.start()
    assert sending.wait(60), "the clients never got going"
    time.sleep(0.005)  # its body is on its way: the request is in flight
    term_at = time.monotonic()
    collector.proc.send_signal(signal.SIGTERM)
    exit_code = collector.proc.wait(60)
    stop.set()
    for t in threads:
        t.join(60)

    assert exit_code == 0, collector.log()
    statuses = {s for _, _, s, _ in results}
    assert not {s for s in statuses if isinstance(s, int) and s != 200}, statuses
    finished_after_term = [r for r in results if r[0] < term_at < r[1] and r[2] == 200]
    assert finished_after_term, "no request was in flight at SIGTERM: make the bodies larger"
    stored = stored_gpu_samples(sqlite_url)
    acked = sample_keys(body for _, _, status, body in results if status == 200)
    assert acked and acked <= stored
