"""A self-signed certificate for 127.0.0.1/localhost, made with the openssl command line."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.metrics.tools import require_binary


def self_signed(directory: Path) -> tuple[Path, Path]:
    """(certificate, key); the certificate is its own CA."""
    require_binary("openssl")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=laggard-test",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )
    return cert, key


@pytest.fixture
def certificate(tmp_path) -> tuple[Path, Path]:
    return self_signed(tmp_path)
