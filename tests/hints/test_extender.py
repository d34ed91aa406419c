"""kube-scheduler extender protocol: exact Go field names out, Go's case-insensitive matching in,
both nodeCacheCapable modes, FailedNodes / FailedAndUnresolvableNodes, scores 0-10, unknown
nodes passing and scoring neutral — first on the pure functions, then over real HTTP on both
databases."""

from __future__ import annotations

import json

import httpx
import pytest

from server.hints import extender
from server.hints.settings import HintSettings
from tests.hints.helpers import T0, collector, open_episode, push_fleet, settings_for

HINTS = {
    "ok-node": {"action": "ok", "capacity": 1.0, "text": ""},
    "slow": {"action": "rebalance", "capacity": 0.85, "text": "thermal: GPU 1 SM clock -15%"},
    "hot": {"action": "avoid", "capacity": 0.62, "text": "thermal: GPU 5 HW thermal slowdown"},
    "dead": {"action": "drain", "capacity": 0.0, "text": "xid: GPU 3 hardware XID 79 (GPU has fallen off the bus)"},
}
CANDIDATES = ["ok-node", "slow", "hot", "dead", "stranger"]
FILTER_KEYS = ["Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"]


def k8s_node(name: str) -> dict:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}, "spec": {}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}}


POD = {"metadata": {"name": "trainer-0", "namespace": "ml"}, "spec": {"containers": [{"name": "main"}]}}


# --- decoding: Go's encoding/json matches keys case-insensitively ------------------------------

@pytest.mark.parametrize("key", ["NodeNames", "nodenames", "nodeNames", "NODENAMES", "NoDeNaMeS"])
def test_node_names_key_in_any_letter_case(key):
    assert extender.decode_args({"Pod": POD, key: ["a", "b"]}).candidates() == ["a", "b"]


@pytest.mark.parametrize(("nodes_key", "items_key", "meta_key", "name_key"), [
    ("Nodes", "items", "metadata", "name"),
    ("nodes", "Items", "Metadata", "Name"),
    ("NODES", "ITEMS", "METADATA", "NAME"),
])
def test_node_list_keys_in_any_letter_case(nodes_key, items_key, meta_key, name_key):
    body = {"pod": POD, nodes_key: {items_key: [{meta_key: {name_key: "a"}}, {meta_key: {name_key: "b"}}]}}
    args = extender.decode_args(body)
    assert args.node_names is None and args.candidates() == ["a", "b"]


def test_go_folding_and_last_key_wins():
    # Go folds with Unicode simple folding: U+017F LATIN SMALL LETTER LONG S matches "s".
    assert extender.decode_args({"NodeName\u017f": ["x"]}).candidates() == ["x"]
    # A repeated field (two spellings): the later one wins, as in encoding/json.
    assert extender.decode_args(json.loads('{"nodenames": ["first"], "NodeNames": ["second"]}')).candidates() == ["second"]
    # Unknown keys are ignored; null means absent (a nil pointer).
    args = extender.decode_args({"Pod": None, "Nodes": None, "NodeNames": ["a"], "Extra": 1})
    assert (args.pod, args.nodes, args.node_names) == (None, None, ["a"])


@pytest.mark.parametrize(("body", "loc"), [
    ([], ["body"]),
    ({"NodeNames": "a"}, ["body", "NodeNames"]),
    ({"NodeNames": [1]}, ["body", "NodeNames"]),
    ({"Nodes": []}, ["body", "Nodes"]),
    ({"Nodes": {"items": {}}}, ["body", "Nodes", "items"]),
    ({"Pod": "p"}, ["body", "Pod"]),
])
def test_malformed_args_are_refused(body, loc):
    with pytest.raises(extender.ProtocolError) as err:
        extender.decode_args(body)
    assert err.value.loc == loc


# --- filter ------------------------------------------------------------------------------------

def test_filter_with_node_cache_capable_answers_node_names():
    args = extender.decode_args({"Pod": POD, "NodeNames": CANDIDATES})
    result = extender.filter_result(args, HINTS, HintSettings())
    assert list(result) == FILTER_KEYS
    assert result["Nodes"] is None and result["Error"] == ""
    assert result["NodeNames"] == ["ok-node", "slow", "stranger"]  # the unknown node passes, order kept
    assert result["FailedNodes"] == {"hot": "laggard: avoid: thermal: GPU 5 HW thermal slowdown"}
    assert result["FailedAndUnresolvableNodes"] == {"dead": "laggard: drain: xid: GPU 3 hardware XID 79 (GPU has fallen off the bus)"}


def test_filter_without_node_cache_answers_the_node_list():
    nodelist = {"kind": "NodeList", "apiVersion": "v1", "metadata": {"resourceVersion": "7"}, "items": [k8s_node(n) for n in CANDIDATES]}
    result = extender.filter_result(extender.decode_args({"Pod": POD, "Nodes": nodelist}), HINTS, HintSettings())
    assert list(result) == FILTER_KEYS and result["NodeNames"] is None
    assert result["Nodes"]["kind"] == "NodeList" and result["Nodes"]["metadata"] == {"resourceVersion": "7"}
    assert result["Nodes"]["items"] == [k8s_node("ok-node"), k8s_node("slow"), k8s_node("stranger")]  # objects as received
    assert set(result["FailedNodes"]) == {"hot"} and set(result["FailedAndUnresolvableNodes"]) == {"dead"}


def test_filter_actions_are_settings():
    cfg = HintSettings(filter_actions=["drain"], unresolvable_actions=[])
    result = extender.filter_result(extender.decode_args({"NodeNames": CANDIDATES}), HINTS, cfg)
    assert result["NodeNames"] == ["ok-node", "slow", "hot", "stranger"]
    assert list(result["FailedNodes"]) == ["dead"] and result["FailedAndUnresolvableNodes"] == {}


# --- prioritize --------------------------------------------------------------------------------

SCORE_CASES = [
    ({"action": "ok", "capacity": 1.0}, 10),
    ({"action": "rebalance", "capacity": 0.85}, 9),  # 8.5 rounds half up
    ({"action": "rebalance", "capacity": 0.84}, 8),
    ({"action": "rebalance", "capacity": 0.04}, 0),
    ({"action": "avoid", "capacity": 0.9}, 0),
    ({"action": "drain", "capacity": 0.0}, 0),
    (None, 10),  # unknown: neutral, like a healthy node
]


@pytest.mark.parametrize(("hint", "expected"), SCORE_CASES)
def test_score(hint, expected):
    assert extender.score(hint, HintSettings()) == expected


def test_prioritize_answers_a_host_priority_list_in_order():
    result = extender.prioritize_result(extender.decode_args({"Pod": POD, "NodeNames": CANDIDATES}), HINTS, HintSettings(unknown_node_score=5))
    assert result == [{"Host": "ok-node", "Score": 10}, {"Host": "slow", "Score": 9}, {"Host": "hot", "Score": 0},
                      {"Host": "dead", "Score": 0}, {"Host": "stranger", "Score": 5}]


# --- over HTTP, from stored episodes, on both databases ----------------------------------------

@pytest.fixture
def extender_server(database_url):
    with collector(settings_for(database_url, scheduler_cluster="prod")) as (server, engine):
        push_fleet(server.url, ["n1", "n2", "n3"], 0, 2)
        push_fleet(server.url, ["n1"], 0, 2, cluster="other")  # same name, other cluster: not the scheduler's
        open_episode(engine, node="n2", gpu=3, cause="thermal", severity="critical", onset=T0, evidence={"clock_deviation": -0.3},
                     summary="GPU 3 HW thermal slowdown")
        open_episode(engine, node="n3", gpu=1, cause="xid", severity="critical", onset=T0, summary="GPU 1 hardware XID 79")
        open_episode(engine, node="n1", gpu=0, cause="clock", severity="warning", onset=T0, evidence={"clock_deviation": -0.2})
        open_episode(engine, node="n1", gpu=0, cause="ecc", severity="critical", onset=T0, cluster="other")
        yield server


def post(url: str, path: str, body) -> httpx.Response:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{url}{path}", content=raw, headers={"Content-Type": "application/json"}, timeout=30)


def test_filter_and_prioritize_over_http(extender_server):
    url = extender_server.url
    names = ["n1", "n2", "n3", "k8s-only"]
    r = post(url, "/scheduler/filter", {"Pod": POD, "Nodes": None, "NodeNames": names})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert list(r.json()) == FILTER_KEYS
    assert r.json()["NodeNames"] == ["n1", "k8s-only"]
    assert r.json()["FailedNodes"] == {"n2": "laggard: avoid: thermal: GPU 3 HW thermal slowdown"}
    assert r.json()["FailedAndUnresolvableNodes"] == {"n3": "laggard: drain: xid: GPU 1 hardware XID 79"}

    r = post(url, "/scheduler/prioritize", {"Pod": POD, "NodeNames": names})
    assert r.status_code == 200
    assert r.json() == [{"Host": "n1", "Score": 8}, {"Host": "n2", "Score": 0}, {"Host": "n3", "Score": 0}, {"Host": "k8s-only", "Score": 10}]
    assert list(r.json()[0]) == ["Host", "Score"]


def test_node_list_mode_and_lower_case_input_over_http(extender_server):
    body = {"pod": POD, "nodes": {"metadata": {}, "items": [k8s_node(n) for n in ("n1", "n2", "n3", "k8s-only")]}}
    r = post(extender_server.url, "/scheduler/filter", body)
    assert r.status_code == 200
    result = r.json()
    assert list(result) == FILTER_KEYS and result["NodeNames"] is None
    assert [i["metadata"]["name"] for i in result["Nodes"]["items"]] == ["n1", "k8s-only"]
    r = post(extender_server.url, "/scheduler/prioritize", body)
    assert [(h["Host"], h["Score"]) for h in r.json()] == [("n1", 8), ("n2", 0), ("n3", 0), ("k8s-only", 10)]


def test_cluster_in_the_path_picks_another_clusters_hints(extender_server):
    r = post(extender_server.url, "/scheduler/clusters/other/filter", {"NodeNames": ["n1", "n2"]})
    assert r.json()["NodeNames"] == ["n2"] and list(r.json()["FailedAndUnresolvableNodes"]) == ["n1"]
    r = post(extender_server.url, "/scheduler/clusters/other/prioritize", {"NodeNames": ["n1", "n2"]})
    assert r.json() == [{"Host": "n1", "Score": 0}, {"Host": "n2", "Score": 10}]  # n2 is unknown there


def test_an_unknown_cluster_is_an_error_not_every_node_passed(extender_server):
    # Issue #16: a typo in urlPrefix ("prdo") passed every node with Error "", filtering silently off.
    r = post(extender_server.url, "/scheduler/clusters/prdo/filter", {"NodeNames": ["n1", "n2"]})
    assert r.status_code == 200 and list(r.json()) == FILTER_KEYS
    assert "unknown cluster 'prdo'" in r.json()["Error"] and "known clusters: other, prod" in r.json()["Error"]
    r = post(extender_server.url, "/scheduler/clusters/prdo/prioritize", {"NodeNames": ["n1", "n2"]})
    assert r.status_code == 404 and "unknown cluster 'prdo'" in r.json()["detail"][0]["msg"]
    assert r.json()["detail"][0]["loc"] == ["path", "cluster"]
    # A known cluster with no problem node is no error.
    assert post(extender_server.url, "/scheduler/clusters/other/filter", {"NodeNames": ["n2"]}).json()["Error"] == ""


@pytest.mark.parametrize(("raw", "loc"), [(b"{not json", ["body"]), (b'{"NodeNames": "n1"}', ["body", "NodeNames"])])
def test_bad_requests_get_the_error_shape(extender_server, raw, loc):
    r = post(extender_server.url, "/scheduler/filter", raw)
    assert r.status_code == 400
    assert r.json()["detail"][0]["loc"] == loc


def test_the_example_scheduler_configuration_points_at_our_routes():
    from pathlib import Path

    import yaml

    from server.app import create_app
    from server.settings import Settings

    path = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "scheduler" / "kube-scheduler-config.yaml"
    config = yaml.safe_load(path.read_text())
    assert (config["apiVersion"], config["kind"]) == ("kubescheduler.config.k8s.io/v1", "KubeSchedulerConfiguration")
    (ext,) = config["extenders"]
    prefix = "/" + ext["urlPrefix"].split("://", 1)[1].split("/", 1)[1]
    routes = set(create_app(Settings()).openapi()["paths"])
    assert prefix.replace("/clusters/prod", "/clusters/{cluster}") + "/" + ext["filterVerb"] in routes
    assert prefix.replace("/clusters/prod", "/clusters/{cluster}") + "/" + ext["prioritizeVerb"] in routes
    assert ext["httpTimeout"] == "5s" and ext["ignorable"] is True and ext["weight"] > 0
