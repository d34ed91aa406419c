"""The webhook signature: X-Laggard-Signature: sha256=<hex HMAC-SHA256 of the raw body>.

Receivers verify it over the bytes they received, before parsing them, with a constant-time
comparison (verify() below does exactly that)."""

from __future__ import annotations

import hashlib
import hmac

HEADER = "X-Laggard-Signature"


def sign(body: bytes, secret: str | bytes) -> str:
    key = secret.encode() if isinstance(secret, str) else secret
    return "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()


def verify(body: bytes, header: str | None, secret: str | bytes) -> bool:
    return header is not None and hmac.compare_digest(header.strip(), sign(body, secret))
