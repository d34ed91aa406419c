"""Acknowledging a hardware fault's remedy over real HTTP with authentication on, on SQLite and
PostgreSQL: POST /api/v1/acks (admin scope) records who and when, the held hint clears, k8s-sync
lifts its taint; a later fault is held again; bad input gets a 4xx in the usual shape; an old
fault that still waits for its remedy survives retention and the hints' history window."""

from __future__ import annotations

import time

import httpx
import pytest

from server.app import create_app
from server.auth.store import create_token
from server.cli.main import main as laggard
from server.hints.held import held_fault_ids
from server.serve import start_in_thread
from server.settings import Settings
from server.store import acks as ack_store
from server.store.engine import make_engine
from server.store.retention import Horizons, apply_retention
from tests.hints.fake_apiserver import FakeApiServer, node
from tests.hints.helpers import T0, body, node_of, open_episode, settings_for

NODE = "gpu-node-006"
XID79 = {"xids": [79], "value": [79], "metric": "xid"}
TAINT = {"key": "laggard.io/straggler", "value": "xid", "effect": "NoSchedule"}


def secure(database_url: str) -> Settings:
    return settings_for(database_url, cooldown_s=5.0).with_changes({"auth": {"insecure": False, "token_cache_s": 0}})


def token(engine, *scopes: str, name: str) -> str:
    with engine.begin() as conn:
        return create_token(conn, scopes=frozenset(scopes), name=name)[0]


def push_until(url: str, admin: str, stop: int, start: int = 0) -> None:
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin}"}, timeout=30) as c:
        for k in range(start, stop):
            for name in (NODE, "gpu-node-001"):
                assert c.post("/api/v1/samples", json=body(name, T0 + k)).status_code == 200


def hint(url: str, read: str, name: str = NODE) -> dict:
    r = httpx.get(f"{url}/api/v1/hints", headers={"Authorization": f"Bearer {read}"}, timeout=30)
    assert r.status_code == 200, r.text
    return node_of(r.json(), name)


def ack(url: str, tok: str, **payload) -> httpx.Response:
    return httpx.post(f"{url}/api/v1/acks", json=payload, headers={"Authorization": f"Bearer {tok}"}, timeout=30)


def test_an_admins_ack_clears_the_held_hint_and_the_taint(database_url):
    settings = secure(database_url)
    server = start_in_thread(create_app(settings))
    engine = make_engine(settings.database_url)
    try:
        url = server.url
        admin, read = token(engine, "admin", name="ops-alice"), token(engine, "read", name="dashboard")
        push_until(url, admin, 1)
        open_episode(engine, node=NODE, gpu=6, cause="xid", severity="critical", onset=T0 + 4, resolved_at=T0 + 9,
                     evidence=XID79, summary="GPU 6 hardware XID 79 (GPU has fallen off the bus)")
        push_until(url, admin, 30, start=1)  # far past the 5 s cool-down
        held = hint(url, read)
        assert held["action"] == "drain" and held["reasons"][0]["held"]["remedy"] == "reboot"

        with FakeApiServer([node(NODE), node("gpu-node-001")]) as k8s:
            sync = ["k8s-sync", "--server", url, "--kube-api", k8s.url, "--apply", "--token", read]
            assert laggard(sync) == 0
            assert k8s.nodes[NODE]["spec"]["taints"] == [TAINT]

            refused = ack(url, read, node=NODE, cluster="prod")
            assert refused.status_code == 403 and refused.json()["detail"][0]["type"] == "forbidden"
            before = time.time()
            made = ack(url, admin, node=NODE, cluster="prod", note="GPU 6 reseated")
            assert made.status_code == 201, made.text
            row = made.json()
            assert (row["node"], row["cluster"], row["gpu"], row["acked_by"], row["note"]) == (NODE, "prod", None, "ops-alice", "GPU 6 reseated")
            assert row["sample_time"] == T0 + 29 and before - 1 <= row["acked_at"] <= time.time() + 1 and row["key_id"]
            assert hint(url, read)["action"] == "ok"

            assert laggard(sync) == 0
            assert k8s.nodes[NODE]["spec"]["taints"] == []

        listed = httpx.get(f"{url}/api/v1/acks", params={"node": NODE}, headers={"Authorization": f"Bearer {admin}"}, timeout=30)
        assert listed.status_code == 200 and listed.json() == {"acks": [row]}

        # A fault that begins after the ack is held again.
        open_episode(engine, node=NODE, gpu=6, cause="xid", severity="critical", onset=T0 + 31, resolved_at=T0 + 33,
                     evidence=XID79, summary="GPU 6 hardware XID 79 (GPU has fallen off the bus)")
        push_until(url, admin, 45, start=30)
        assert hint(url, read)["action"] == "drain"
    finally:
        engine.dispose()
        server.stop()

    # Stored: a restarted collector still knows who acknowledged what.
    with engine.connect() as conn:
        assert [r["acked_by"] for r in ack_store.list_acks(conn, cluster="prod", node=NODE)] == ["ops-alice"]
    engine.dispose()


BAD_ACKS = [
    ({"node": "nope", "cluster": "prod"}, 404, ["body", "node"]),
    ({"node": NODE, "cluster": "prod", "gpu": -1}, 422, ["body", "gpu"]),
    ({"node": "gpu\x00node", "cluster": "prod"}, 422, ["body", "node"]),
    ({"node": NODE, "cluster": "prod", "note": "x" * 1001}, 422, ["body", "note"]),
    ({"cluster": "prod"}, 422, ["body", "node"]),
]


@pytest.mark.parametrize(("payload", "status", "loc"), BAD_ACKS)
def test_bad_acks_are_refused_in_the_usual_shape(database_url, payload, status, loc):
    settings = secure(database_url)
    server = start_in_thread(create_app(settings))
    engine = make_engine(settings.database_url)
    try:
        admin = token(engine, "admin", name="ops")
        push_until(server.url, admin, 1)
        r = ack(server.url, admin, **payload)
        assert r.status_code == status, r.text
        [detail] = r.json()["detail"]
        assert detail["loc"] == loc and detail["msg"] and detail["type"]
        with engine.connect() as conn:
            assert ack_store.list_acks(conn) == []
    finally:
        engine.dispose()
        server.stop()


def test_a_fault_waiting_for_its_remedy_outlives_retention_and_the_history_window(database_url):
    settings = settings_for(database_url, cooldown_s=5.0, history_s=3600.0)
    server = start_in_thread(create_app(settings))
    engine = make_engine(settings.database_url)
    now = time.time()
    eight_days = now - 8 * 86400
    try:
        push_until(server.url, "unused", 1)  # insecure: any token
        waiting = open_episode(engine, node=NODE, gpu=6, cause="xid", severity="critical", onset=eight_days, resolved_at=eight_days + 5,
                               evidence=XID79, summary="GPU 6 hardware XID 79 (GPU has fallen off the bus)")
        open_episode(engine, node=NODE, gpu=5, cause="xid", severity="critical", onset=eight_days, resolved_at=eight_days + 5,
                     evidence={"xids": [94]}, summary="GPU 5 hardware XID 94 (contained ECC error)")
        deleted = apply_retention(engine, now=now, horizons=Horizons.same(7 * 86400), keep_episodes=held_fault_ids)
        assert deleted["episodes"] == 1  # the XID 94 one: a restarted application was its remedy
        assert node_of(httpx.get(f"{server.url}/api/v1/hints", timeout=30).json(), NODE)["reasons"][0]["episode"] == waiting

        with engine.begin() as conn:
            ack_store.add_ack(conn, cluster="prod", node=NODE, gpu=6, acked_by="ops")
        assert node_of(httpx.get(f"{server.url}/api/v1/hints", timeout=30).json(), NODE)["action"] == "ok"
        assert apply_retention(engine, now=now, horizons=Horizons.same(7 * 86400), keep_episodes=held_fault_ids)["episodes"] == 1

        # An old XID 48 on a node that has booted since goes too.
        open_episode(engine, node="gpu-node-001", gpu=2, cause="xid", severity="critical", onset=eight_days,
                     resolved_at=eight_days + 5, evidence={"xids": [48]}, summary="GPU 2 hardware XID 48 (double-bit ECC error)")
        assert apply_retention(engine, now=now, horizons=Horizons.same(7 * 86400), keep_episodes=held_fault_ids)["episodes"] == 0
        payload = body("gpu-node-001", T0 + 1) | {"agent": {"version": "0.1.0", "boot_time": T0}}
        assert httpx.post(f"{server.url}/api/v1/samples", json=payload, timeout=30).status_code == 200
        assert apply_retention(engine, now=now, horizons=Horizons.same(7 * 86400), keep_episodes=held_fault_ids)["episodes"] == 1
    finally:
        engine.dispose()
        server.stop()
