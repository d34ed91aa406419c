from __future__ import annotations

import gzip
import json
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agent.push import MemoryQueue, Pusher
from agent.sample import GpuSample, NicSample, Sample, build_batch


class Collector:
    """A real HTTP server on 127.0.0.1 that records requests and answers from a script."""

    def __init__(self, port: int = 0, script: list[tuple[int, dict, dict]] | None = None) -> None:
        self.requests: list[dict] = []
        self.script = list(script or [])  # (status, json body, headers); then 200s
        collector = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, like the real collector

            def do_POST(self):
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                body = gzip.decompress(raw) if self.headers.get("Content-Encoding") == "gzip" else raw
                collector.requests.append({"path": self.path, "headers": dict(self.headers), "raw": raw,
                                           "json": json.loads(body)})
                if collector.script:
                    status, reply, headers = collector.script.pop(0)
                else:
                    status, reply, headers = 200, {"accepted": len(json.loads(body)["samples"])}, {}
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def batch_sizes(self):
        return [len(r["json"]["samples"]) for r in self.requests]


@pytest.fixture
def collector():
    c = Collector()
    yield c
    c.close()


def make_sample(i: int, ts: float | None = None) -> Sample:
    return Sample(
        ts=time.time() if ts is None else ts,
        gpus=[GpuSample(index=0, uuid="GPU-0", temp_c=40.0 + i, power_w=None)],
        nics=[NicSample(device="mlx5_0", port=1, state="ACTIVE", tx_bytes_total=4 * i)],
    )


def make_pusher(url: str, **kw) -> Pusher:
    kw.setdefault("backoff_base", 0.01)
    kw.setdefault("backoff_max", 0.05)
    kw.setdefault("timeout", 2.0)
    return Pusher(url, node="node-a", cluster="c1", labels={"rack": "r1"},
                  agent_info={"version": "0.1.0", "driver": "550.54", "cuda": "12.4"}, **kw)


def wait_until(pred, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_gzip_body_round_trip_and_headers(collector):
    p = make_pusher(collector.url, batch_size=3, token="s3cret")
    samples = [make_sample(i, ts=1000.0 + i) for i in range(3)]
    for s in samples:
        p.submit(s)
    assert p.send_once() is None
    p.close()
    [req] = collector.requests
    assert req["path"] == "/api/v1/samples"
    assert req["headers"]["Content-Encoding"] == "gzip"
    assert req["headers"]["Content-Type"] == "application/json"
    assert req["headers"]["Authorization"] == "Bearer s3cret"
    assert req["raw"][:2] == b"\x1f\x8b"
    expected = build_batch(samples, node="node-a", cluster="c1", labels={"rack": "r1"},
                           agent_info={"version": "0.1.0", "driver": "550.54", "cuda": "12.4"})
    assert req["json"] == expected
    assert req["json"]["samples"][0]["gpus"][0]["power_w"] is None  # None stays null
    assert p.stats.sent_samples == 3 and len(p.queue) == 0


def test_no_token_no_auth_header(collector):
    p = make_pusher(collector.url, batch_size=1)
    p.submit(make_sample(0))
    p.send_once()
    p.close()
    assert "Authorization" not in collector.requests[0]["headers"]


def test_retries_503_then_succeeds(collector):
    collector.script = [(503, {"error": "busy"}, {}), (503, {"error": "busy"}, {})]
    p = make_pusher(collector.url, batch_size=2)
    p.submit(make_sample(0))
    p.submit(make_sample(1))
    d1 = p.send_once()
    d2 = p.send_once()
    assert d1 is not None and d2 is not None and 0 < d1 <= 0.05 and 0 < d2 <= 0.05
    assert len(p.queue) == 2  # still queued while the collector is unhappy
    assert p.send_once() is None
    p.close()
    assert len(collector.requests) == 3
    assert collector.requests[0]["json"] == collector.requests[2]["json"]
    assert p.stats.failed_attempts == 2 and p.stats.sent_samples == 2


def test_background_thread_retries_429_and_5xx(collector):
    collector.script = [(429, {"error": "slow down"}, {}), (500, {"error": "oops"}, {}), (502, {}, {})]
    p = make_pusher(collector.url, batch_size=2).start()
    p.submit(make_sample(0))
    p.submit(make_sample(1))
    wait_until(lambda: p.stats.sent_samples == 2)
    p.close()
    assert len(collector.requests) == 4


def test_retry_after_is_honoured_but_capped(collector):
    collector.script = [(429, {"error": "slow down"}, {"Retry-After": "3"})]
    p = make_pusher(collector.url, batch_size=1, backoff_max=1.5)
    p.submit(make_sample(0))
    assert p.send_once() == 1.5
    p.close(flush_timeout=0)


def test_no_retry_on_422_and_body_logged(collector, caplog):
    collector.script = [(422, {"error": "bad sample", "detail": "gpus[0].temp_c"}, {})]
    p = make_pusher(collector.url, batch_size=2)
    p.submit(make_sample(0))
    p.submit(make_sample(1))
    with caplog.at_level(logging.ERROR, logger="agent.push"):
        assert p.send_once() is None
    assert len(p.queue) == 0 and p.stats.rejected_batches == 1 and p.stats.rejected_samples == 2
    assert "gpus[0].temp_c" in caplog.text and "422" in caplog.text
    p.close()
    assert len(collector.requests) == 1


@pytest.mark.parametrize("status", [400, 413])
def test_other_permanent_statuses_drop(collector, status):
    collector.script = [(status, {"error": "no"}, {})]
    p = make_pusher(collector.url, batch_size=1)
    p.submit(make_sample(0))
    p.submit(make_sample(1))
    assert p.send_once() is None
    assert p.send_once() is None
    p.close()
    assert p.stats.rejected_samples == 1 and p.stats.sent_samples == 1


def test_connection_refused_then_collector_comes_up():
    port = free_port()
    p = make_pusher(f"http://127.0.0.1:{port}", batch_size=1).start()
    p.submit(make_sample(0))
    wait_until(lambda: p.stats.failed_attempts >= 3)
    assert len(p.queue) == 1
    c = Collector(port=port)
    try:
        wait_until(lambda: p.stats.sent_samples == 1)
        p.close()
        assert len(c.requests) == 1
    finally:
        c.close()


def test_backoff_grows_and_stays_bounded():
    p = make_pusher("http://127.0.0.1:9", backoff_base=1.0, backoff_max=8.0)
    delays = []
    for n in range(1, 8):
        p._failures = n
        delays.append(p._backoff(None))
    p.close(flush_timeout=0)
    assert 0.5 <= delays[0] <= 1.0
    assert 2.0 <= delays[2] <= 4.0
    assert all(4.0 <= d <= 8.0 for d in delays[3:])


def test_batches_of_n_and_final_flush(collector):
    p = make_pusher(collector.url, batch_size=4, max_delay=60.0).start()
    for i in range(10):
        p.submit(make_sample(i))
    wait_until(lambda: p.stats.sent_samples == 8)
    time.sleep(0.1)
    assert collector.batch_sizes() == [4, 4]  # the last 2 wait for a full batch
    p.close()
    assert collector.batch_sizes() == [4, 4, 2]
    temps = [s["gpus"][0]["temp_c"] for r in collector.requests for s in r["json"]["samples"]]
    assert temps == [40.0 + i for i in range(10)]  # in order, none lost


def test_partial_batch_goes_out_after_max_delay(collector):
    p = make_pusher(collector.url, batch_size=10, max_delay=0.2).start()
    p.submit(make_sample(0))
    wait_until(lambda: p.stats.sent_samples == 1, timeout=3.0)
    p.close()
    assert collector.batch_sizes() == [1]


def test_memory_queue_drops_oldest_and_counts():
    q = MemoryQueue(maxlen=3)
    for i in range(5):
        q.put(make_sample(i))
    assert q.dropped == 2 and len(q) == 3
    assert [seq for seq, _ in q.peek(10)] == [2, 3, 4]
    q.ack(3)
    assert [seq for seq, _ in q.peek(10)] == [4]


def test_retry_resends_current_head_after_overflow(collector):
    collector.script = [(503, {}, {})]
    p = make_pusher(collector.url, batch_size=2, queue=MemoryQueue(maxlen=3))
    for i in range(3):
        p.submit(make_sample(i))
    assert p.send_once() is not None
    p.submit(make_sample(3))  # pushes sample 0 out while its batch was failing
    assert p.dropped == 1
    assert p.send_once() is None
    p.close()
    temps = [[s["gpus"][0]["temp_c"] for s in r["json"]["samples"]] for r in collector.requests]
    assert temps == [[40.0, 41.0], [41.0, 42.0], [43.0]]


def test_415_falls_back_to_uncompressed(collector):
    collector.script = [(415, {"detail": "gzip not accepted"}, {})]
    p = make_pusher(collector.url, batch_size=1)
    p.submit(make_sample(0))
    assert p.send_once() == 0.0
    assert p.send_once() is None
    p.close()
    first, second = collector.requests
    assert first["headers"]["Content-Encoding"] == "gzip"
    assert "Content-Encoding" not in second["headers"]
    assert second["json"] == first["json"]


def test_unencodable_batch_is_dropped_not_retried(collector, caplog):
    p = make_pusher(collector.url, batch_size=1)
    p.submit(Sample(ts=time.time(), gpus=[object()]))
    p.submit(make_sample(1))
    with caplog.at_level(logging.ERROR, logger="agent.push"):
        assert p.send_once() is None
    assert "cannot encode" in caplog.text
    assert p.send_once() is None
    p.close()
    assert p.stats.rejected_samples == 1 and collector.batch_sizes() == [1]
