"""Slow and stuck clients against the real collector (uvicorn on loopback, raw sockets): a body
that stops short of its Content-Length is answered 408 once the body timeout passes, and the
connection is closed, instead of holding it forever; a client that goes away mid-body is one
INFO line, not an ERROR with a traceback."""

from __future__ import annotations

import json
import logging
import socket
import time

import httpx
import pytest

from server.app import create_app
from server.serve import start_in_thread
from server.settings import Settings
from tests.server.payloads import batch

BODY_TIMEOUT_S = 0.5


@pytest.fixture
def collector(sqlite_url):
    running = start_in_thread(create_app(Settings(database_url=sqlite_url, insecure=True, detection_enabled=False,
                                                  body_timeout_s=BODY_TIMEOUT_S)))
    yield running
    running.stop()


def _connect(collector) -> socket.socket:
    sock = socket.create_connection((collector.host, collector.port), timeout=10 + BODY_TIMEOUT_S)
    return sock


def _head(path: str, length: int, *, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: collector\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n{extra}\r\n").encode()


def _read_all(sock: socket.socket) -> bytes:
    """Everything the collector sends until it closes the connection."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _response(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    return int(status_line.split()[1]), headers, body


@pytest.mark.parametrize("path", ["/api/v1/samples", "/api/v1/tokens", "/scheduler/filter"])
def test_a_body_short_of_its_content_length_is_408_and_the_connection_closed(collector, path):
    body = json.dumps(batch()).encode()
    with _connect(collector) as sock:
        sock.sendall(_head(path, len(body) + 1000) + body)  # promises 1000 bytes more than it sends
        started = time.monotonic()
        raw = _read_all(sock)  # returns only once the collector closes the connection
        waited = time.monotonic() - started
    status, headers, content = _response(raw)
    assert status == 408, raw
    assert headers["connection"] == "close"
    detail = json.loads(content)["detail"]
    assert [(d["loc"], d["type"]) for d in detail] == [(["body"], "body_timeout")]
    assert set(detail[0]) == {"loc", "msg", "type"}
    assert waited >= BODY_TIMEOUT_S * 0.9
    # The collector still serves everyone else.
    assert httpx.get(f"{collector.url}/healthz", timeout=10).status_code == 200


def test_a_trickling_body_is_bounded_as_a_whole_not_per_read(collector):
    # One byte at a time, each well within the timeout: the body as a whole is what is bounded.
    body = json.dumps(batch()).encode()
    with _connect(collector) as sock:
        sock.sendall(_head("/api/v1/samples", len(body)))
        status = None
        for i in range(len(body)):
            try:
                sock.sendall(body[i:i + 1])
            except OSError:  # the collector answered and closed: stop sending
                break
            time.sleep(BODY_TIMEOUT_S / 5)
        raw = _read_all(sock)
        status = _response(raw)[0]
    assert status == 408


def test_a_body_in_time_is_stored(collector):
    body = json.dumps(batch()).encode()
    with _connect(collector) as sock:
        sock.sendall(_head("/api/v1/samples", len(body), extra="Connection: close\r\n") + body[:10])
        time.sleep(BODY_TIMEOUT_S / 3)
        sock.sendall(body[10:])
        status, _, content = _response(_read_all(sock))
    assert status == 200, content
    assert json.loads(content) == {"accepted": 1}


def test_a_client_gone_mid_body_is_one_info_line(collector, caplog):
    body = json.dumps(batch()).encode()
    with caplog.at_level(logging.INFO):
        with _connect(collector) as sock:
            sock.sendall(_head("/api/v1/samples", len(body)) + body[: len(body) // 2])
            time.sleep(BODY_TIMEOUT_S / 5)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any("disconnected" in r.getMessage() for r in caplog.records):
            time.sleep(0.05)
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not errors, [(r.name, r.getMessage()) for r in errors]
    gone = [r for r in caplog.records if "disconnected" in r.getMessage()]
    assert len(gone) == 1 and gone[0].levelno == logging.INFO and gone[0].exc_info is None, gone
    assert "/api/v1/samples" in gone[0].getMessage()
