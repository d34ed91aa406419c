"""Limits by work over real HTTP (issue #12): a token over its budget of rows, or registering
node names too fast, gets 429 with Retry-After (409 past a cluster's cap on nodes) and stores
nothing, while another token is still served."""

from __future__ import annotations

from sqlalchemy import func, select

from server.ingest.settings import IngestLimits
from server.settings import Settings
from server.store import schema
from tests.auth.conftest import SecureCollector
from tests.server.payloads import batch, encode


def _settings(sqlite_url: str, **limits) -> Settings:
    return Settings(database_url=sqlite_url, insecure=False, token_cache_s=0, detection_enabled=False, retention_interval_s=3600,
                    ingest_limits=IngestLimits(**limits))


def _push(http, **kw):
    content, headers = encode(batch(**kw), gzipped=True)
    return http.post("/api/v1/samples", content=content, headers=headers)


def _stored_nodes(c: SecureCollector) -> set[str]:
    with c.engine.connect() as conn:
        return set(conn.execute(select(schema.Node.name)).scalars())


def test_a_token_over_its_rows_gets_429_with_retry_after_while_another_is_served(sqlite_url):
    c = SecureCollector(_settings(sqlite_url, rows_per_s_per_token=10.0, rows_burst_per_token=100.0))
    try:
        heavy, light = c.token("agent", cluster="prod-a"), c.token("agent", cluster="prod-a")
        with c.client(heavy) as http:
            # 25 samples x (8 GPUs + 1 port) = 225 rows: let in on a positive balance, leaving a debt of 125 rows.
            assert _push(http, node="heavy", samples=25, gpus=8).json() == {"accepted": 25}
            refused = _push(http, node="heavy", samples=1, gpus=8, ts=1_700_000_000.0)
        assert refused.status_code == 429
        assert 10 <= int(refused.headers["retry-after"]) <= 14  # 125 rows at 10/s
        assert refused.json()["detail"][0]["type"] == "rate_limited"
        with c.client(light) as http:
            assert _push(http, node="light", samples=1, gpus=8).json() == {"accepted": 1}
        with c.engine.connect() as conn:
            assert conn.execute(select(func.count()).select_from(schema.GpuSample)).scalar() == 25 * 8 + 8
    finally:
        c.close()


def test_new_node_names_are_limited_per_token_and_capped_per_cluster(sqlite_url):
    c = SecureCollector(_settings(sqlite_url, node_registrations_per_min_per_token=2.0, max_nodes_per_cluster=3))
    try:
        spray, other = c.token("agent", cluster="prod-a"), c.token("agent", cluster="prod-a")
        with c.client(spray) as http:
            codes = [_push(http, node=f"fake-{i}").status_code for i in range(3)]
            again = _push(http, node="fake-0")  # a known node costs no registration
            limited = _push(http, node="fake-9")
        assert codes == [200, 200, 429] and again.status_code == 200
        assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
        assert limited.json()["detail"][0]["loc"] == ["body", "node"]
        with c.client(other) as http:
            assert _push(http, node="real-1").status_code == 200  # the third node of the cluster
            full = _push(http, node="real-2")
        assert full.status_code == 409 and full.json()["detail"][0]["type"] == "too_many_nodes"
        assert "real-2" in full.json()["detail"][0]["msg"]
        assert _stored_nodes(c) == {"fake-0", "fake-1", "real-1"}
    finally:
        c.close()
