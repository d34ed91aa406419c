"""Who may call what, over real HTTP: 401 without a (valid) token, 403 without the scope, and
an agent token bound to its cluster (and named nodes)."""

from __future__ import annotations

import pytest

from server.settings import Settings
from tests.auth.conftest import SecureCollector
from tests.server.conftest import stored_gpu_samples
from tests.server.payloads import batch, encode

READS = ["/api/v1/nodes", "/api/v1/stragglers", "/api/v1/hints", "/metrics"]
FILTER = {"Pod": {"metadata": {"name": "p"}}, "NodeNames": ["n1"]}


def push(client, body):
    content, headers = encode(body, gzipped=True)
    return client.post("/api/v1/samples", content=content, headers=headers)


@pytest.mark.parametrize("header", [None, "Bearer", "Bearer nonsense", "Bearer lgd_000000000000_unknownsecret", "Basic dXNlcjpwdw=="])
def test_no_valid_token_is_401_naming_the_header(collector, header):
    with collector.client() as c:
        for method, path in [("GET", "/api/v1/nodes"), ("POST", "/api/v1/samples"), ("GET", "/metrics"), ("GET", "/api/v1/tokens")]:
            r = c.request(method, path, headers={"Authorization": header} if header else {})
            assert r.status_code == 401, (method, path, r.text)
            assert r.headers["www-authenticate"].startswith("Bearer")
            assert r.json()["detail"][0]["loc"] == ["header", "authorization"]


def test_health_and_readiness_stay_open(collector):
    with collector.client() as c:
        assert c.get("/healthz").status_code == 200
        assert c.get("/readyz").status_code == 200


def test_each_scope_opens_its_own_endpoints_only(collector):
    agent, read, scheduler = collector.token("agent", cluster="prod-a"), collector.token("read"), collector.token("scheduler")
    with collector.client(read) as c:
        assert [c.get(p).status_code for p in READS] == [200] * len(READS)
        assert push(c, batch(node="n1")).status_code == 403
        assert c.post("/scheduler/filter", json=FILTER).status_code == 403
        assert c.get("/api/v1/tokens").status_code == 403
    with collector.client(agent) as c:
        assert push(c, batch(node="n1")).status_code == 200
        assert [c.get(p).status_code for p in READS] == [403] * len(READS)
        r = c.get("/api/v1/nodes")
        assert r.json()["detail"][0]["type"] == "forbidden" and "read" in r.json()["detail"][0]["msg"]
    with collector.client(scheduler) as c:
        assert c.post("/scheduler/filter", json=FILTER).status_code == 200
        assert c.get("/api/v1/hints").status_code == 200  # the extender's sync reads hints
        assert c.get("/api/v1/nodes").status_code == 403


def test_admin_may_do_everything(collector):
    admin = collector.token("admin")
    with collector.client(admin) as c:
        assert push(c, batch(node="anywhere", cluster="any-cluster")).status_code == 200
        assert [c.get(p).status_code for p in READS] == [200] * len(READS)
        assert c.post("/scheduler/filter", json=FILTER).status_code == 200
        assert c.get("/api/v1/tokens").status_code == 200


def test_agent_token_pushes_for_its_cluster_only_and_a_refusal_stores_nothing(collector):
    agent = collector.token("agent", cluster="prod-a")
    with collector.client(agent) as c:
        r = push(c, batch(node="n1", cluster="prod-b", samples=3))
        assert r.status_code == 403
        assert r.json()["detail"][0]["loc"] == ["body", "cluster"]
        assert "prod-a" in r.json()["detail"][0]["msg"]
        assert stored_gpu_samples(collector.engine) == 0
        # The default cluster is a cluster like any other.
        assert push(c, {k: v for k, v in batch(node="n1").items() if k != "cluster"}).status_code == 403
        assert push(c, batch(node="n1", cluster="prod-a", samples=3)).status_code == 200
        assert stored_gpu_samples(collector.engine) == 3 * 2


def test_agent_token_for_named_nodes(collector):
    agent = collector.token("agent", cluster="prod-a", nodes=["n1", "n2"])
    with collector.client(agent) as c:
        assert push(c, batch(node="n2", cluster="prod-a")).status_code == 200
        r = push(c, batch(node="n3", cluster="prod-a"))
        assert r.status_code == 403 and r.json()["detail"][0]["loc"] == ["body", "node"]


def test_bad_input_from_a_good_token_is_still_422(collector):
    agent = collector.token("agent", cluster="prod-a")
    body = batch(node="n1", cluster="prod-a")
    body["samples"][0]["gpus"][0]["temp_c"] = "hot"
    with collector.client(agent) as c:
        r = push(c, body)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "temp_c"


@pytest.mark.parametrize(("flag", "path", "method", "body"), [
    ("metrics_public", "/metrics", "GET", None),
    ("scheduler_public", "/scheduler/filter", "POST", FILTER),
])
def test_metrics_and_extender_can_be_opened(sqlite_url, flag, path, method, body):
    closed = SecureCollector(Settings(database_url=sqlite_url, insecure=False, detection_enabled=False))
    try:
        with closed.client() as c:
            assert c.request(method, path, json=body).status_code == 401
    finally:
        closed.close()
    opened = SecureCollector(Settings(database_url=sqlite_url, insecure=False, detection_enabled=False, **{flag: True}))
    try:
        with opened.client() as c:
            assert c.request(method, path, json=body).status_code == 200
            assert c.get("/api/v1/nodes").status_code == 401  # only that one opens
    finally:
        opened.close()


def test_insecure_turns_authentication_off_and_says_so(sqlite_url, caplog):
    c = SecureCollector(Settings(database_url=sqlite_url, insecure=True, detection_enabled=False))
    try:
        with c.client() as http:
            assert push(http, batch(node="n1")).status_code == 200
            assert http.get("/api/v1/nodes").status_code == 200
    finally:
        c.close()
    assert any("AUTHENTICATION IS OFF" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)
