"""`laggard server --tls-cert --tls-key` serves HTTPS, and nothing in plain HTTP."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import time

import httpx
import pytest

from tests.auth.tls import certificate  # noqa: F401 (fixture)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_https(url: str, ca: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        try:
            httpx.get(url, verify=ssl.create_default_context(cafile=ca), timeout=2)
            return
        except httpx.TransportError:
            time.sleep(0.2)
    raise AssertionError("server did not come up")


@pytest.mark.parametrize("workers", [1, 2])
def test_server_speaks_https_only(sqlite_url, certificate, workers):  # noqa: F811
    cert, key = certificate
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "server.cli", "--log-level", "warning", "server", "--port", str(port), "--workers", str(workers),
                             "--database-url", sqlite_url, "--tls-cert", str(cert), "--tls-key", str(key)],
                            env=os.environ | {"LAGGARD_DETECTION_ENABLED": "false"}, stderr=subprocess.PIPE, text=True)
    try:
        wait_https(f"https://127.0.0.1:{port}/healthz", str(cert), proc)
        assert httpx.get(f"https://127.0.0.1:{port}/healthz", verify=ssl.create_default_context(cafile=str(cert))).json() == {"status": "ok"}
        with pytest.raises(httpx.ConnectError):  # unknown CA: refused by the client
            httpx.get(f"https://127.0.0.1:{port}/healthz")
        with pytest.raises(httpx.HTTPError):  # plain HTTP gets no answer
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_certificate_without_its_key_is_refused(sqlite_url, certificate):  # noqa: F811
    cert, _key = certificate
    done = subprocess.run([sys.executable, "-m", "server.cli", "server", "--database-url", sqlite_url, "--tls-cert", str(cert)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "--tls-key" in done.stderr
