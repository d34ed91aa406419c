"""The read API over real HTTP: nodes, one node with its latest readings, GPU series."""

from __future__ import annotations

import httpx
import pytest

from server.settings import Settings
from tests.server.conftest import stored_gpu_samples
from tests.server.payloads import batch, encode

T0 = 1_790_000_000.0


@pytest.fixture
def api(live_server):
    with httpx.Client(base_url=live_server.url, timeout=30) as http:
        yield http


def _push(api, body):
    content, headers = encode(body, gzipped=True)
    r = api.post("/api/v1/samples", content=content, headers=headers)
    assert r.status_code == 200, r.text


def test_nodes_list_and_detail_with_latest_sample(api):
    body = batch(node="n1", samples=3, gpus=2, ts=T0)
    body["samples"][2]["gpus"][1]["temp_c"] = 88.5
    _push(api, body)
    _push(api, batch(node="n2", cluster="prod-b", samples=1, gpus=1, ts=T0))

    nodes = api.get("/api/v1/nodes").json()["nodes"]
    assert [(n["cluster"], n["node"], n["gpu_count"]) for n in nodes] == [("prod-a", "n1", 2), ("prod-b", "n2", 1)]
    assert nodes[0]["last_seen"] == T0 + 2
    assert nodes[0]["agent"]["driver"] == "550.54.15"
    assert api.get("/api/v1/nodes", params={"cluster": "prod-b"}).json()["nodes"][0]["node"] == "n2"

    detail = api.get("/api/v1/nodes/n1").json()
    assert detail["labels"] == {"job": "llm-a", "rack": "r12"}
    assert [g["index"] for g in detail["gpus"]] == [0, 1]
    assert detail["gpus"][1]["latest"]["ts"] == T0 + 2
    assert detail["gpus"][1]["latest"]["temp_c"] == 88.5
    assert detail["nics"][0]["device"] == "mlx5_0"
    assert detail["nics"][0]["latest"]["state"] == "ACTIVE"


def test_unknown_node_is_404_with_a_json_body(api):
    r = api.get("/api/v1/nodes/nope")
    assert r.status_code == 404
    assert "nope" in r.json()["detail"][0]["msg"]


def test_same_node_name_in_two_clusters_needs_the_cluster(api):
    _push(api, batch(node="twin", cluster="a", ts=T0))
    _push(api, batch(node="twin", cluster="b", ts=T0))
    assert api.get("/api/v1/nodes/twin").status_code == 409
    assert api.get("/api/v1/nodes/twin", params={"cluster": "b"}).json()["cluster"] == "b"


def test_gpu_series_in_range_and_in_order(api):
    body = batch(samples=5, gpus=1, ts=T0)
    for i, s in enumerate(body["samples"]):
        s["gpus"][0]["sm_clock_mhz"] = 1000 + i
    _push(api, body)
    uuid = body["samples"][0]["gpus"][0]["uuid"]
    r = api.get(f"/api/v1/gpus/{uuid}/series", params={"metric": "sm_clock_mhz", "since": T0 + 1, "until": T0 + 3})
    assert r.status_code == 200, r.text
    assert r.json()["points"] == [[T0 + 1, 1001], [T0 + 2, 1002], [T0 + 3, 1003]]


@pytest.mark.parametrize(
    "params,status,loc",
    [
        ({"metric": "bogus"}, 422, ["query", "metric"]),
        ({}, 422, ["query", "metric"]),
        ({"metric": "temp_c", "since": 10, "until": 5}, 422, ["query", "since"]),
    ],
)
def test_gpu_series_bad_queries(api, params, status, loc):
    body = batch(gpus=1, ts=T0)
    _push(api, body)
    uuid = body["samples"][0]["gpus"][0]["uuid"]
    r = api.get(f"/api/v1/gpus/{uuid}/series", params=params)
    assert r.status_code == status
    assert r.json()["detail"][0]["loc"] == loc


NON_FINITE = [
    # (path, query, loc of the error): nan and inf parsed as floats and compared as such
    ("/api/v1/gpus/{uuid}/series", {"metric": "temp_c", "since": "nan"}, ["query", "since"]),
    ("/api/v1/gpus/{uuid}/series", {"metric": "temp_c", "until": "inf"}, ["query", "until"]),
    ("/api/v1/gpus/{uuid}/series", {"metric": "temp_c", "since": "-infinity", "until": "1"}, ["query", "since"]),
    ("/api/v1/stragglers/history", {"since": "nan", "until": "1"}, ["query", "since"]),
    ("/api/v1/stragglers/history", {"since": "0", "until": "inf"}, ["query", "until"]),
]


@pytest.mark.parametrize("path,params,loc", NON_FINITE, ids=[f"{p[0]} {p[1]}" for p in NON_FINITE])
def test_non_finite_time_bounds_are_422(api, path, params, loc):
    body = batch(gpus=1, ts=T0)
    _push(api, body)
    r = api.get(path.format(uuid=body["samples"][0]["gpus"][0]["uuid"]), params=params)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == loc


@pytest.mark.parametrize(
    "path,params",
    [
        ("/api/v1/gpus/GPU-x/series", {"metric": "temp_c", "since": "yesterday"}),  # not a number
        ("/api/v1/gpus/GPU-x/series", {"metric": "temp_c", "limit": "0"}),  # out of range
        ("/api/v1/stragglers/history", {}),  # missing
        ("/api/v1/stragglers", {"cause": "boredom"}),  # not one of the causes
    ],
)
def test_read_api_422_bodies_have_the_shape_ingest_uses(api, path, params):
    # FastAPI's own validation errors carried "input", "ctx" and "url" besides loc/msg/type.
    r = api.get(path, params=params)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert detail and all(set(d) == {"loc", "msg", "type"} and d["loc"][0] == "query" for d in detail), detail


def test_unknown_gpu_is_404(api):
    assert api.get("/api/v1/gpus/GPU-none/series", params={"metric": "temp_c"}).status_code == 404


def test_resent_batch_is_stored_once(api, db):
    body = batch(samples=3, gpus=2, ts=T0)
    body["samples"][0]["gpus"][0]["xids"] = [{"xid": 79, "ts": T0}]
    _push(api, body)
    _push(api, body)
    assert stored_gpu_samples(db) == 6


def test_gpu_moving_to_another_node_follows_it(api):
    body = batch(node="old-home", gpus=1, ts=T0)
    _push(api, body)
    # Once its old node has stopped reporting it for gpu_move_after_s (sooner is a conflict,
    # tests/auth/test_gpu_identity.py).
    moved = batch(node="new-home", gpus=1, ts=T0 + Settings().ingest.gpu_move_after_s + 10)
    moved["samples"][0]["gpus"][0]["uuid"] = body["samples"][0]["gpus"][0]["uuid"]
    _push(api, moved)
    assert [g["uuid"] for g in api.get("/api/v1/nodes/new-home").json()["gpus"]] == [body["samples"][0]["gpus"][0]["uuid"]]
    assert api.get("/api/v1/nodes/old-home").json()["gpus"] == []


def test_gpu_changing_slot_and_model_on_its_node_is_updated_not_refused(api):
    # A GPU re-seated in another slot, or whose model the agent learnt late, once answered 500.
    body = batch(node="n1", gpus=2, ts=T0)
    first, second = (g["uuid"] for g in body["samples"][0]["gpus"])
    _push(api, body)
    swapped = batch(node="n1", gpus=2, ts=T0 + 10)
    for gpu, uuid in zip(swapped["samples"][0]["gpus"], (second, first)):
        gpu["uuid"] = uuid
    swapped["samples"][0]["gpus"][0]["model"] = "NVIDIA H200"
    _push(api, swapped)
    swapped["samples"][0]["ts"] = T0 + 20
    _push(api, swapped)  # and again, now that the collector knows the new slot

    gpus = {g["uuid"]: g for g in api.get("/api/v1/nodes/n1").json()["gpus"]}
    assert (gpus[second]["index"], gpus[second]["model"]) == (0, "NVIDIA H200")
    assert gpus[first]["index"] == 1
    assert gpus[second]["latest"]["ts"] == T0 + 20
    series = api.get(f"/api/v1/gpus/{second}/series", params={"metric": "temp_c", "since": T0, "until": T0 + 20}).json()
    assert len(series["points"]) == 3


def test_a_gpu_replaced_in_its_slot_leaves_the_node_view(api):
    """A node back from repair with GPU 1 swapped listed both GPUs at index 1, the old one with
    its last readings of before the repair."""
    body = batch(node="n1", gpus=2, ts=T0)
    first, old = (g["uuid"] for g in body["samples"][0]["gpus"])
    _push(api, body)
    back = batch(node="n1", gpus=2, ts=T0 + 3600)
    back["samples"][0]["gpus"][0]["uuid"] = first
    back["samples"][0]["gpus"][1]["uuid"] = new = "GPU-00000000-0000-0000-0000-00000000beef"
    _push(api, back)
    assert [(g["index"], g["uuid"]) for g in api.get("/api/v1/nodes/n1").json()["gpus"]] == [(0, first), (1, new)]
    assert old not in {g["uuid"] for g in api.get("/api/v1/nodes/n1").json()["gpus"]}


def test_a_vanished_gpu_stays_in_the_node_view_when_the_others_are_renumbered(api):
    body = batch(node="n1", gpus=3, ts=T0)
    uuids = [g["uuid"] for g in body["samples"][0]["gpus"]]
    _push(api, body)
    after = batch(node="n1", gpus=2, ts=T0 + 10)  # GPU 1 fell off the bus; GPU 2 is now GPU 1
    for gpu, uuid in zip(after["samples"][0]["gpus"], (uuids[0], uuids[2])):
        gpu["uuid"] = uuid
    _push(api, after)
    assert sorted(g["uuid"] for g in api.get("/api/v1/nodes/n1").json()["gpus"]) == sorted(uuids)


def test_health_and_readiness(api):
    assert api.get("/healthz").json() == {"status": "ok"}
    assert api.get("/readyz").json()["database"] == "ok"
