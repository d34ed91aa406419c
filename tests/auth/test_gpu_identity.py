"""A GPU (by UUID) belongs to one node: no push may move, overwrite or hide a GPU of a cluster or
node its token may not write, a UUID reported by two live nodes is a 409 naming both, and a GPU
whose node stopped reporting it moves (issue #12, items 1 and 2). Real HTTP, both databases."""

from __future__ import annotations

import logging
import time

import pytest
from sqlalchemy import func, select

from server.settings import Settings
from server.store import schema
from tests.auth.conftest import SecureCollector
from tests.server.payloads import batch, encode

T0 = time.time() - 3600
MOVE_AFTER_S = 120.0


@pytest.fixture
def collector(database_url):
    c = SecureCollector(Settings(database_url=database_url, insecure=False, token_cache_s=0, detection_enabled=False,
                                 retention_interval_s=3600, gpu_move_after_s=MOVE_AFTER_S))
    yield c
    c.close()


def push(client, body):
    raw, headers = encode(body)
    return client.post("/api/v1/samples", content=raw, headers=headers)


def claiming(body: dict, uuid: str, *, temp_c: float | None = None) -> dict:
    """The batch with its first GPU reporting `uuid` (and a reading of its own)."""
    for sample in body["samples"]:
        first = dict(sample["gpus"][0], uuid=uuid)
        if temp_c is not None:
            first["temp_c"] = temp_c
        sample["gpus"] = [first, *sample["gpus"][1:]]
    return body


def uuids_of(client, cluster: str, node: str) -> list[str]:
    r = client.get(f"/api/v1/nodes/{node}", params={"cluster": cluster})
    assert r.status_code == 200, r.text
    return [g["uuid"] for g in r.json()["gpus"]]


def samples_of(collector, cluster: str, node: str) -> int:
    G, N, S = schema.Gpu.__table__, schema.Node.__table__, schema.GpuSample.__table__
    with collector.engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(S.join(G, G.c.id == S.c.gpu_id).join(N, N.c.id == G.c.node_id))
                            .where(N.c.cluster == cluster, N.c.name == node)).scalar_one()


def hottest(collector, uuid: str) -> float:
    G, S = schema.Gpu.__table__, schema.GpuSample.__table__
    with collector.engine.connect() as conn:
        return conn.execute(select(func.max(S.c.temp_c)).join(G, G.c.id == S.c.gpu_id).where(G.c.uuid == uuid)).scalar_one()


def test_a_token_of_another_cluster_cannot_take_over_a_gpu(collector):
    victim_token = collector.token("agent", cluster="c2")
    attacker_token = collector.token("agent", cluster="c1", nodes=["n1"])
    reader = collector.token("read")
    victim = batch(node="victim", cluster="c2", samples=2, gpus=2, ts=T0)
    uuid = victim["samples"][0]["gpus"][0]["uuid"]
    with collector.client(victim_token) as v, collector.client(attacker_token) as a, collector.client(reader) as r:
        assert push(v, victim).status_code == 200
        attack = push(a, claiming(batch(node="n1", cluster="c1", samples=2, gpus=1, ts=T0 + 10), uuid, temp_c=198.0))
        assert attack.status_code == 409, attack.text
        detail = attack.json()["detail"][0]
        assert detail["type"] == "gpu_conflict" and uuid in detail["msg"]
        told = detail["msg"].replace(uuid, "")
        assert "victim" not in told and "c2" not in told  # another cluster's names are not told
        # Even long after the victim's last sample: a GPU never leaves a cluster the token may not write.
        late = push(a, claiming(batch(node="n1", cluster="c1", samples=1, gpus=1, ts=T0 + 10 * MOVE_AFTER_S), uuid, temp_c=198.0))
        assert late.status_code == 409
        assert uuids_of(r, "c2", "victim") == [uuid, victim["samples"][0]["gpus"][1]["uuid"]]
        assert hottest(collector, uuid) < 100
        assert samples_of(collector, "c1", "n1") == 0
        # The victim's own next push is stored, not just acknowledged.
        assert push(v, batch(node="victim", cluster="c2", samples=3, gpus=2, ts=T0 + 20)).json() == {"accepted": 3}
        assert samples_of(collector, "c2", "victim") == (2 + 3) * 2


def test_a_node_bound_token_cannot_move_another_nodes_gpu_even_when_it_went_quiet(collector):
    owner = collector.token("agent", cluster="c1", nodes=["n2"])
    other = collector.token("agent", cluster="c1", nodes=["n1"])
    reader = collector.token("read")
    first = batch(node="n2", cluster="c1", samples=1, gpus=1, ts=T0)
    uuid = first["samples"][0]["gpus"][0]["uuid"]
    with collector.client(owner) as o, collector.client(other) as n1, collector.client(reader) as r:
        assert push(o, first).status_code == 200
        answer = push(n1, claiming(batch(node="n1", cluster="c1", samples=1, gpus=1, ts=T0 + 2 * MOVE_AFTER_S), uuid))
        assert answer.status_code == 409
        assert "'n2'" in answer.json()["detail"][0]["msg"] and "'n1'" in answer.json()["detail"][0]["msg"]
        assert uuids_of(r, "c1", "n2") == [uuid]


def test_two_live_nodes_reporting_one_uuid_conflict_and_nothing_acknowledged_is_lost(collector, caplog):
    agent = collector.token("agent", cluster="c1")
    reader = collector.token("read")
    caplog.set_level(logging.WARNING, logger="server.store.writer")
    shared = batch(node="a", cluster="c1", samples=1, gpus=1, ts=T0)["samples"][0]["gpus"][0]["uuid"]
    accepted = {"a": 0, "b": 0}
    statuses = {"a": [], "b": []}
    with collector.client(agent) as c, collector.client(reader) as r:
        for step in range(4):
            for node in ("a", "b"):
                body = claiming(batch(node=node, cluster="c1", samples=2, gpus=2, ts=T0 + 10 * step), shared)
                answer = push(c, body)
                statuses[node].append(answer.status_code)
                if answer.status_code == 200:
                    accepted[node] += answer.json()["accepted"]
                else:
                    msg = answer.json()["detail"][0]["msg"]
                    assert "'a'" in msg and "'b'" in msg and shared in msg
        assert statuses == {"a": [200] * 4, "b": [409] * 4}
        assert samples_of(collector, "c1", "a") == accepted["a"] * 2
        assert samples_of(collector, "c1", "b") == 0  # nothing half-accepted: not even b's own second GPU
        assert uuids_of(r, "c1", "a")[0] == shared
        with collector.engine.connect() as conn:
            assert conn.execute(select(func.count()).select_from(schema.Node.__table__).where(schema.Node.name == "b")).scalar_one() == 0
        metrics = r.get("/metrics")
        assert metrics.status_code == 200
        assert 'laggard_ingest_gpu_conflicts_total{cluster="c1"} 4' in metrics.text
    warned = [rec.getMessage() for rec in caplog.records if "409" in rec.getMessage()]
    assert len(warned) == 1 and shared in warned[0]  # one line, not one per push


def test_a_gpu_whose_node_stopped_reporting_it_moves(collector):
    agent = collector.token("agent", cluster="c1")
    reader = collector.token("read")
    old = batch(node="old", cluster="c1", samples=2, gpus=1, ts=T0)
    uuid = old["samples"][0]["gpus"][0]["uuid"]
    with collector.client(agent) as c, collector.client(reader) as r:
        assert push(c, old).status_code == 200
        # The old node keeps reporting, but not this GPU (it was pulled and put into "new").
        assert push(c, batch(node="old", cluster="c1", samples=1, gpus=0, ts=T0 + MOVE_AFTER_S + 5)).status_code == 200
        moved = push(c, claiming(batch(node="new", cluster="c1", samples=2, gpus=1, ts=T0 + MOVE_AFTER_S + 5), uuid))
        assert moved.status_code == 200, moved.text
        assert uuids_of(r, "c1", "new") == [uuid]
        assert uuids_of(r, "c1", "old") == []
        assert samples_of(collector, "c1", "new") == 4  # its history follows the GPU
