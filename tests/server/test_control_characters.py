"""Control characters in names and in read-API parameters, on both databases alike. A NUL in
`node`, `uuid` or `model` was stored on SQLite and a 500 (DataError) on PostgreSQL, which agents
retry forever; a NUL in a read-API path or query was a 500 on PostgreSQL. Both: a 422 naming
the field, nothing stored."""

from __future__ import annotations

import httpx
import pytest

from server.store import schema
from tests.server.conftest import count_rows, stored_gpu_samples
from tests.server.payloads import batch, encode

T0 = 1_790_000_000.0


@pytest.fixture
def api(live_server):
    with httpx.Client(base_url=live_server.url, timeout=30) as http:
        yield http


def _post(api, body) -> httpx.Response:
    content, headers = encode(body, gzipped=True)
    return api.post("/api/v1/samples", content=content, headers=headers)


PUSHES = [
    # (case id, mutate(body), loc of the error)
    ("node", lambda b: b.update(node="gpu\x00node"), ["body", "node"]),
    ("uuid", lambda b: b["samples"][0]["gpus"][0].update(uuid="GPU-\x00"), ["body", "samples", 0, "gpus", 0, "uuid"]),
    ("model", lambda b: b["samples"][0]["gpus"][1].update(model="\x00"), ["body", "samples", 0, "gpus", 1, "model"]),
    ("cluster", lambda b: b.update(cluster="prod\x00"), ["body", "cluster"]),
    ("nic device", lambda b: b["samples"][0]["nics"][0].update(device="mlx5_\x00"), ["body", "samples", 0, "nics", 0, "device"]),
    ("label value", lambda b: b.update(labels={"job": "a\x00"}), ["body", "labels", "job"]),
]


@pytest.mark.parametrize("case,mutate,loc", PUSHES, ids=[p[0] for p in PUSHES])
def test_nul_in_a_pushed_name_is_422_and_nothing_is_stored(api, db, case, mutate, loc):
    body = batch(ts=T0)
    mutate(body)
    r = _post(api, body)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == loc
    assert "control characters" in r.json()["detail"][0]["msg"]
    assert stored_gpu_samples(db) == 0 and count_rows(db, schema.Node) == 0
    assert _post(api, batch(ts=T0)).status_code == 200  # the same connection, the next push


READS = [
    # (path, query, loc of the error)
    ("/api/v1/nodes/gpu%00node", {}, ["path", "node"]),
    ("/api/v1/nodes/gpu-node-001", {"cluster": "prod-a\x00"}, ["query", "cluster"]),
    ("/api/v1/nodes", {"cluster": "\x00"}, ["query", "cluster"]),
    ("/api/v1/gpus/GPU-%00/series", {"metric": "temp_c"}, ["path", "uuid"]),
    ("/api/v1/gpus/GPU-prod-a.gpu-node-001-0000/series", {"metric": "temp_c\x00"}, ["query", "metric"]),
    ("/api/v1/stragglers", {"node": "n\x00"}, ["query", "node"]),
    ("/api/v1/stragglers/history", {"since": 0, "until": 1, "cluster": "c\x00"}, ["query", "cluster"]),
    ("/api/v1/hints", {"node": "\x00"}, ["query", "node"]),
    ("/api/v1/hints/slurm", {"cluster": "\x1b"}, ["query", "cluster"]),
]


@pytest.mark.parametrize("path,params,loc", READS, ids=[f"{r[0]} {list(r[1])}" for r in READS])
def test_nul_in_a_read_api_path_or_query_is_422(api, path, params, loc):
    assert _post(api, batch(ts=T0)).status_code == 200
    r = api.get(path, params=params)
    assert r.status_code == 422, r.text
    assert r.json() == {"detail": [{"loc": loc, "msg": r.json()["detail"][0]["msg"], "type": "control_character"}]}
    assert api.get("/api/v1/nodes/gpu-node-001").status_code == 200  # the connection still serves


def test_a_token_bound_to_a_name_with_nul_is_422(api):
    r = api.post("/api/v1/tokens", json={"scopes": ["agent"], "cluster": "prod\x00"})
    assert r.status_code == 422, r.text
    assert [d["loc"] for d in r.json()["detail"]] == [["body", "cluster"]]
