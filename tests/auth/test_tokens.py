"""Token lifecycle: made by the CLI or the admin API, shown once, stored hashed, listed without
secrets, revoked; the store on both databases."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from sqlalchemy import select

from server.auth import store
from server.auth.tokens import key_id_of
from server.store import schema
from tests.auth.test_scopes import push
from tests.server.payloads import batch


@pytest.fixture
def engine(migrated_engine):
    return migrated_engine


def test_store_keeps_only_a_hash_and_finds_the_principal(engine):
    with engine.begin() as conn:
        token, info = store.create_token(conn, scopes=frozenset({"agent"}), cluster="prod-a", nodes=["n2", "n1", "n1"], name="rack 12")
    with engine.connect() as conn:
        row = conn.execute(select(schema.ApiToken)).one()
        assert token not in " ".join(str(v) for v in row)
        assert row.token_hash != token and len(row.token_hash) == 64
        principal = store.principal_for(conn, token=token)
    assert principal.scopes == {"agent"} and principal.cluster == "prod-a" and principal.nodes == {"n1", "n2"}
    assert info.nodes == ["n1", "n2"] and key_id_of(token) == info.key_id
    with engine.connect() as conn:
        # Right key id, wrong secret: refused.
        assert store.principal_for(conn, token=token[:-4] + "AAAA") is None
        assert store.principal_for(conn, token="not-a-token") is None


def test_revoked_tokens_stop_and_stay_listed(engine):
    with engine.begin() as conn:
        token, info = store.create_token(conn, scopes=frozenset({"read"}))
        assert store.revoke_token(conn, key_id=info.key_id, now=123.0)
        assert not store.revoke_token(conn, key_id=info.key_id)  # already revoked
        assert store.principal_for(conn, token=token) is None
        assert [(t.key_id, t.revoked_at) for t in store.list_tokens(conn)] == [(info.key_id, 123.0)]
        assert store.list_tokens(conn, include_revoked=False) == []


@pytest.mark.parametrize(("scopes", "cluster", "nodes"), [
    ({"agent"}, None, None),             # an agent token belongs to one cluster
    ({"read"}, None, ["n1"]),            # nodes only mean something for agents
])
def test_store_refuses_tokens_that_make_no_sense(engine, scopes, cluster, nodes):
    with engine.begin() as conn, pytest.raises(ValueError):
        store.create_token(conn, scopes=frozenset(scopes), cluster=cluster, nodes=nodes)


def test_admin_api_creates_lists_and_revokes(collector):
    admin = collector.token("admin")
    with collector.client(admin) as c:
        r = c.post("/api/v1/tokens", json={"scopes": ["agent"], "cluster": "prod-a", "name": "daemonset"})
        assert r.status_code == 201, r.text
        created = r.json()
        listed = c.get("/api/v1/tokens").json()["tokens"]
        assert created["token"] not in str(listed) and all("token" not in t and "token_hash" not in t for t in listed)
        assert [t["key_id"] for t in listed][-1] == created["key_id"]
        with collector.client(created["token"]) as agent:
            assert push(agent, batch(node="n1", cluster="prod-a")).status_code == 200
            assert c.delete(f"/api/v1/tokens/{created['key_id']}").status_code == 200
            assert push(agent, batch(node="n1", cluster="prod-a")).status_code == 401  # token_cache_s=0 here
        assert c.delete(f"/api/v1/tokens/{created['key_id']}").status_code == 404
        bad = c.post("/api/v1/tokens", json={"scopes": ["agent"]})  # no cluster
        assert bad.status_code == 422 and "cluster" in bad.json()["detail"][0]["msg"]
        assert c.post("/api/v1/tokens", json={"scopes": ["root"]}).status_code == 422


def test_cli_prints_the_token_alone_on_stdout_and_it_works(collector):
    env = os.environ | {"LAGGARD_DATABASE_URL": collector.settings.database_url}
    made = subprocess.run([sys.executable, "-m", "server.cli", "token", "create", "--scope", "agent", "--cluster", "prod-a", "--name", "ci"],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert made.stdout == token + "\n" and key_id_of(token)
    with collector.client(token) as agent:
        assert push(agent, batch(node="n1", cluster="prod-a")).status_code == 200
    listed = subprocess.run([sys.executable, "-m", "server.cli", "token", "list"], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert key_id_of(token) in listed.stdout and token not in listed.stdout
    revoked = subprocess.run([sys.executable, "-m", "server.cli", "token", "revoke", key_id_of(token)], env=env, capture_output=True, text=True,
                             timeout=60, check=False)
    assert revoked.returncode == 0, revoked.stderr
    with collector.client(token) as agent:
        assert push(agent, batch(node="n1", cluster="prod-a")).status_code == 401
    refused = subprocess.run([sys.executable, "-m", "server.cli", "token", "create", "--scope", "agent"], env=env, capture_output=True, text=True,
                             timeout=60, check=False)
    assert refused.returncode == 2 and refused.stdout == "" and "cluster" in refused.stderr


@pytest.mark.parametrize(("scopes", "cluster", "nodes"), [
    (("agent",), "prod-a", ["n2", "n1"]),
    (("agent",), "prod-a", None),
    (("read", "scheduler"), None, None),
])
def test_a_token_tells_its_holder_what_it_is_bound_to(collector, scopes, cluster, nodes):
    token = collector.token(*scopes, cluster=cluster, nodes=nodes)
    with collector.client(token) as c:
        r = c.get("/api/v1/tokens/self")
    assert r.status_code == 200, r.text
    assert r.json() == {"key_id": key_id_of(token), "name": "", "scopes": sorted(scopes), "cluster": cluster,
                        "nodes": sorted(nodes) if nodes else None}
    with collector.client("lgd_000000000000_unknownsecret") as c:
        assert c.get("/api/v1/tokens/self").status_code == 401
