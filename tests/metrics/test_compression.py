"""GET /metrics gzipped when the scraper asks for it, as Prometheus does on every scrape
(server/api/compression.py): the same series either way, over a real HTTP round trip."""

from __future__ import annotations

import gzip

import httpx
import pytest

from server.compression import accepts_gzip
from tests.metrics.test_slices import MOVING, two_cluster_server  # noqa: F401 (fixture)
from tests.metrics.tools import samples

ACCEPT_ENCODING = [
    ("gzip", True),
    ("gzip, deflate, br", True),  # httpx, curl --compressed
    ("GZIP;Q=0.5", True),
    ("x-gzip", True),
    ("*", True),
    ("br;q=1, gzip;q=0.001", True),
    ("identity", False),
    ("deflate", False),
    ("", False),
    (None, False),
    ("gzip;q=0", False),
    ("*;q=0.5, gzip;q=0", False),  # refused by name though * is accepted
    ("*;q=0", False),
    ("gzip;q=abc", False),
]


@pytest.mark.parametrize(("header", "accepted"), ACCEPT_ENCODING)
def test_accept_encoding_is_read_as_rfc_9110_says(header, accepted):
    assert accepts_gzip(header) is accepted


def _scrape(url: str, accept_encoding: str) -> tuple[httpx.Response, bytes]:
    """The response and its body as sent (httpx would undo the gzip on its own)."""
    with httpx.Client(timeout=30) as client, client.stream("GET", f"{url}/metrics", headers={"Accept-Encoding": accept_encoding}) as r:
        return r, b"".join(r.iter_raw())


def test_a_scrape_that_accepts_gzip_gets_the_same_series_gzipped(two_cluster_server):  # noqa: F811
    url = two_cluster_server
    zipped, raw = _scrape(url, "gzip")
    plain, body = _scrape(url, "identity")
    assert zipped.status_code == plain.status_code == 200
    assert zipped.headers["content-encoding"] == "gzip" and "content-encoding" not in plain.headers
    assert "Accept-Encoding" in zipped.headers["vary"] and "Accept-Encoding" in plain.headers["vary"]
    assert zipped.headers["content-type"] == plain.headers["content-type"]
    text = gzip.decompress(raw).decode()
    assert len(raw) * 3 < len(text.encode())
    unzipped, expected = samples(text), samples(body.decode())
    assert unzipped.keys() == expected.keys()
    for key, value in expected.items():
        if not key[0].startswith(MOVING):
            assert unzipped[key] == pytest.approx(value), key
