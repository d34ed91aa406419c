"""GET /api/v1/hints gzipped for a client that asks (slurm-sync and k8s-sync poll it with httpx,
which asks; at 100,000 GPUs the document is 7.8 MB of JSON), the same document either way."""

from __future__ import annotations

import gzip
import json

import httpx
import pytest

from tests.hints.helpers import T0, collector, open_episode, push_fleet, settings_for


def _get(url: str, accept_encoding: str, **params) -> tuple[httpx.Response, bytes]:
    """The response and its body as sent (httpx would undo the gzip on its own)."""
    with httpx.Client(timeout=30) as client, client.stream("GET", f"{url}/api/v1/hints", params=params,
                                                          headers={"Accept-Encoding": accept_encoding}) as r:
        return r, b"".join(r.iter_raw())


@pytest.mark.parametrize("params", [{}, {"problems_only": "true"}], ids=["whole", "problems_only"])
def test_hints_are_gzipped_for_a_client_that_asks_and_the_same_document(sqlite_url, params):
    with collector(settings_for(sqlite_url, cache_ttl_s=60.0, max_stale_s=60.0)) as (server, engine):
        push_fleet(server.url, [f"n{i}" for i in range(6)], 0, 1)
        for i in range(3):
            open_episode(engine, node=f"n{i}", gpu=i, cause="thermal", severity="critical", onset=T0)
        zipped, raw = _get(server.url, "gzip", **params)
        again, raw_again = _get(server.url, "gzip", **params)  # the same snapshot: compressed once, kept
        plain, body = _get(server.url, "identity", **params)
    assert zipped.status_code == again.status_code == plain.status_code == 200
    assert zipped.headers["content-encoding"] == "gzip" and "content-encoding" not in plain.headers
    assert zipped.headers["vary"] == plain.headers["vary"] == "Accept-Encoding"
    assert raw_again == raw and len(raw) * 3 < len(body)
    doc = json.loads(gzip.decompress(raw))
    assert doc == json.loads(body)
    assert len(doc["nodes"]) == (3 if params else 6)
