"""Sending one notification to one receiver.

- webhook: POST the Alertmanager v4 payload (payload.notification), signed with
  X-Laggard-Signature when the receiver has a secret;
- alertmanager: POST the alerts to <url>/api/v2/alerts, firing ones with an endsAt a few resend
  periods ahead (Alertmanager resolves an alert at its endsAt unless it is posted again), resolved
  ones with their endsAt.

A failure raises DeliveryError with a message safe to log: the HTTP status or the exception's
class, never the URL (webhook URLs often carry tokens), a header or the body.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from server import __version__
from server.alerts import signing
from server.alerts.payload import notification, postable
from server.alerts.routing import Receiver


class DeliveryError(Exception):
    pass


def send(transport: httpx.BaseTransport, receiver: Receiver, alerts: Sequence[Mapping[str, Any]], *, external_url: str,
         dashboard_url: str | None, now: float, firing_ends_at: float, timeout_s: float) -> None:
    headers = {"User-Agent": f"laggard/{__version__}", "Content-Type": "application/json", **receiver.headers}
    if receiver.type == "alertmanager":
        body_doc: Any = [postable(a, external_url=external_url, dashboard_url=dashboard_url, ends_at=firing_ends_at) for a in alerts]
        url = receiver.url.rstrip("/") + "/api/v2/alerts"
    else:
        body_doc = notification(alerts, receiver=receiver.name, external_url=external_url, dashboard_url=dashboard_url)
        url = receiver.url
    body = json.dumps(body_doc, separators=(",", ":")).encode()
    if receiver.secret and receiver.type == "webhook":
        headers[signing.HEADER] = signing.sign(body, receiver.secret)
    timeout = httpx.Timeout(receiver.timeout_s or timeout_s)
    request = httpx.Request("POST", url, content=body, headers=headers, extensions={"timeout": timeout.as_dict()})
    # Straight to the transport, not through httpx.Client: the client logs every request's full
    # URL at INFO, and a webhook URL is often a secret. Redirects are not followed.
    try:
        response = transport.handle_request(request)
        try:
            response.read()
        finally:
            response.close()
    except httpx.HTTPError as exc:
        raise DeliveryError(type(exc).__name__) from None
    if not 200 <= response.status_code < 300:
        raise DeliveryError(f"HTTP {response.status_code}")
