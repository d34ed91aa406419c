"""The status page over HTTP (no browser): each view renders from stored samples and episodes,
escapes what agents sent, loads nothing from off host (under a proxy's path prefix too), serves
its assets from the package, lands an alert's generatorURL query on the episode, and stays out
of the OpenAPI schema."""

from __future__ import annotations

import re
import time
from html.parser import HTMLParser

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from server.settings import Settings
from server.store import episodes
from tests.server.payloads import batch, encode

HOSTILE = "<img src=x onerror=alert(1)>\"&"
CONTENT_TYPES = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []
        self.scripts_inline = 0

    def handle_starttag(self, tag, attrs) -> None:
        attrs = dict(attrs)
        self.found.extend(v for k, v in attrs.items() if k in ("src", "href", "action") and v)
        self.scripts_inline += tag == "script" and "src" not in attrs
        assert "style" not in attrs, f"inline style on <{tag}>: the page's CSP refuses it"
        assert not any(k.startswith("on") for k in attrs), f"inline handler on <{tag}>"


def links(html: str) -> _Links:
    parser = _Links()
    parser.feed(html)
    return parser


def push(client: TestClient, body: dict) -> None:
    content, headers = encode(body, gzipped=True)
    r = client.post("/api/v1/samples", content=content, headers=headers)
    assert r.status_code == 200, r.text


@pytest.fixture
def app(sqlite_url):
    return create_app(Settings(database_url=sqlite_url, insecure=True, detection_enabled=False, retention_interval_s=3600))


@pytest.fixture
def client(app):
    with TestClient(app) as c:
        now = time.time()
        for node in ("n1", "n2", HOSTILE):
            push(c, batch(node=node, cluster="prod", samples=30, gpus=4, ts=now - 60))
        with app.state.services.engine.begin() as conn:
            ids = [episodes.open_episode(conn, cluster="prod", node="n1", gpu=1, uuid="GPU-prod.n1-0001", entity="gpu:x", cause="thermal",
                                         severity="critical", onset=now - 40, detected_at=now - 39, summary=f"hot {HOSTILE}",
                                         evidence={"metric": "sm_clock_mhz", "value": 975, "note": HOSTILE,
                                                   "workload": "job llm-a, pod llm-a-worker-3", "job": "llm-a"}),
                   episodes.open_episode(conn, cluster="prod", node=HOSTILE, gpu=None, uuid=None, entity=f"nic:prod/{HOSTILE}/mlx5_0/1",
                                         cause="network", severity="warning", onset=now - 40, detected_at=now - 39, summary="slow port",
                                         evidence={"metric": "rate_gbps", "device": "mlx5_0", "port": 1})]
        c.episode_ids = ids
        yield c


def test_every_view_renders_and_escapes_what_agents_sent(client):
    thermal, network = client.episode_ids
    for path in ("/ui", "/ui?cluster=prod", f"/ui/episodes/{thermal}", f"/ui/episodes/{network}", "/ui/nodes/n1?cluster=prod", "/ui/nodes/n1",
                 "/ui/stragglers?cluster=prod"):
        r = client.get(path)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), (path, r.status_code, r.text[:300])
        assert HOSTILE not in r.text and "<img src=x" not in r.text, path
        parsed = links(r.text)
        assert parsed.scripts_inline == 0, path
    fleet = client.get("/ui").text
    assert fleet.count('data-state="flagged"') == 1 and 'data-node="n1" data-gpu="1" data-state="flagged" data-cause="thermal"' in fleet
    assert "&lt;img src=x onerror=alert(1)&gt;&quot;&amp;" in fleet  # the hostile node is listed, as text
    page = client.get(f"/ui/episodes/{thermal}").text
    assert 'class="gpu-line"' in page and 'class="peer-band"' in page and "prod|NVIDIA H100 80GB HBM3|llm-a" in page
    # Whose job it slows, as the detector attributed it (issue #15), among the facts.
    assert "<td>workload</td><td>job llm-a, pod llm-a-worker-3</td>" in page.replace("\n", "")
    port = client.get(f"/ui/episodes/{network}").text
    assert 'class="gpu-line"' in port and "mlx5_0 port 1" in port
    node = client.get("/ui/nodes/n1?cluster=prod").text
    assert "laggard.io/straggler=thermal:PreferNoSchedule" in node and "Weight raised" in node  # thermal critical: avoid


def test_a_node_name_in_two_clusters_or_none(client):
    push(client, batch(node="n1", cluster="other", gpus=1))
    r = client.get("/ui/nodes/n1")
    assert r.status_code == 409 and "/ui/nodes/n1?cluster=other" in r.text and "/ui/nodes/n1?cluster=prod" in r.text
    assert client.get("/ui/nodes/n1?cluster=other").status_code == 200
    assert client.get("/ui/nodes/nowhere").status_code == 404
    assert client.get("/ui/episodes/99999").status_code == 404
    assert client.get("/ui/episodes/notanumber").status_code == 422


def test_the_generator_url_query_lands_on_the_episode(client):
    thermal, _ = client.episode_ids
    r = client.get("/ui/stragglers?cluster=prod&node=n1", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == f"/ui/episodes/{thermal}"
    assert client.get("/ui/stragglers?cluster=prod&node=n1&gpu=1", follow_redirects=False).status_code == 303
    listed = client.get("/ui/stragglers?cluster=prod", follow_redirects=False)
    assert listed.status_code == 200 and listed.text.count("/ui/episodes/") == 2


@pytest.mark.parametrize("root_path", ["", "/laggard"])
def test_nothing_is_loaded_from_off_host_and_every_asset_is_served(client, root_path):
    thermal, _ = client.episode_ids
    proxied = TestClient(client.app, root_path=root_path)
    for path in ("/ui", f"/ui/episodes/{thermal}", "/ui/nodes/n1?cluster=prod", "/ui/login"):
        r = proxied.get(path)
        assert r.status_code == 200, path
        found = links(r.text).found
        assert found
        assert [u for u in found if re.match(r"^([a-z][a-z0-9+.-]*:|//)", u, re.IGNORECASE)] == [], path
        assert all(u.startswith(f"{root_path}/") for u in found), (path, found)
        # only the SVG namespace, never a URL that is fetched
        assert not re.search(r"(src|href|action)=\"https?:", r.text)
        csp = r.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "script-src 'self'" in csp and "style-src 'self'" in csp
        for url in found:
            if "/ui/static/" in url:
                asset = proxied.get(url.removeprefix(root_path))
                suffix = url[url.rfind("."):]
                assert asset.status_code == 200 and asset.headers["content-type"].startswith(CONTENT_TYPES[suffix]), url
                assert len(asset.content) > 100


def test_static_files_and_the_schema(client):
    assert client.get("/ui/static/nothing.js").status_code == 404
    assert client.get("/ui/static/..%2Fchart.py").status_code == 404
    assert client.head("/ui/static/ui.css").status_code == 200
    assert not [p for p in client.get("/openapi.json").json()["paths"] if p.startswith("/ui")]


def test_the_refresh_period(client):
    assert 'data-refresh="10"' in client.get("/ui").text
    assert 'data-refresh="0"' in client.get("/ui?refresh=0").text and "http-equiv" not in client.get("/ui?refresh=0").text
    assert '<meta http-equiv="refresh" content="3">' in client.get("/ui?refresh=3").text  # without JavaScript
    assert client.get("/ui?refresh=-1").status_code == 422
