"""`laggard k8s-sync` against a local stand-in for the API server (tests/hints/fake_apiserver.py),
through the official client: GET the nodes, PATCH their taints (strategic merge, with the
resourceVersion) and PATCH nodes/{name}/status for the condition; only its own taint is ever
touched; dry run by default; a conflict is retried on a fresh read."""

from __future__ import annotations

import pytest

from server.cli.main import main as laggard
from server.hints import k8s_sync, slurm_sync
from server.hints.compute import KnownNode, compute_hints
from server.hints.render import by_node_name
from server.hints.settings import HintSettings
from tests.hints.fake_apiserver import FakeApiServer, node
from tests.hints.helpers import HintsServer, hint_doc

KEY = "laggard.io/straggler"
FOREIGN = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
STRATEGIC = "application/strategic-merge-patch+json"


def cluster_nodes():
    return [
        node("hot", taints=[FOREIGN]),  # avoid → PreferNoSchedule, the foreign taint kept
        node("dead"),  # drain → NoSchedule
        node("fine"),  # ok → no taint, condition False
        node("healed", taints=[{"key": KEY, "value": "xid", "effect": "NoSchedule"}, FOREIGN],
             conditions=[{"type": "LaggardStraggler", "status": "True", "reason": "Drain", "message": "old",
                          "lastHeartbeatTime": "2025-01-01T00:00:00Z", "lastTransitionTime": "2025-01-01T00:00:00Z"}]),
        node("cpu-only"),  # unknown to laggard: untouched
    ]


DOC = hint_doc(
    ("hot", "avoid", 0.62, [("thermal", "GPU 5 HW thermal slowdown")]),
    ("dead", "drain", 0.0, [("xid", "GPU 3 hardware XID 79 (GPU has fallen off the bus)"), ("thermal", "GPU 1 hot")]),
    ("fine", "ok", 1.0, []),
    ("healed", "rebalance", 0.9, [("clock", "GPU 2 SM clock -10%")]),
    ("not-in-k8s", "drain", 0.0, [("ecc", "GPU 0 ECC")]),
)


@pytest.fixture
def apiserver():
    with FakeApiServer(cluster_nodes()) as fake:
        yield fake


@pytest.fixture
def hints():
    with HintsServer(DOC) as server:
        yield server


def sync(apiserver, hints, *extra) -> int:
    return laggard(["k8s-sync", "--server", hints.url, "--kube-api", apiserver.url, *extra])


def taints(apiserver, name):
    return apiserver.nodes[name]["spec"].get("taints", [])


def condition(apiserver, name):
    return next((c for c in apiserver.nodes[name]["status"]["conditions"] if c["type"] == "LaggardStraggler"), None)


def test_dry_run_prints_the_plan_and_writes_nothing(apiserver, hints, capsys):
    assert sync(apiserver, hints) == 0
    out = capsys.readouterr().out.splitlines()
    assert apiserver.writes() == []
    assert [(r["method"], r["path"]) for r in apiserver.requests] == [("GET", "/api/v1/nodes")]
    assert "(dry run) node hot: add taint laggard.io/straggler=thermal:PreferNoSchedule" in out
    assert "(dry run) node dead: add taint laggard.io/straggler=xid:NoSchedule" in out
    assert "(dry run) node healed: remove taint laggard.io/straggler=xid:NoSchedule" in out
    assert any(line.startswith("(dry run) node fine: set condition LaggardStraggler=False (NoStraggler)") for line in out)
    assert not any("cpu-only" in line for line in out)
    assert out[-1] == "5 Kubernetes nodes, 4 with hints: 4 nodes to change, planned (dry run; --apply to act)"
    assert hints.queries == ["/api/v1/hints"]


def test_apply_patches_taints_and_conditions(apiserver, hints):
    assert sync(apiserver, hints, "--apply") == 0
    writes = apiserver.writes()
    assert {w["content_type"] for w in writes} == {STRATEGIC}
    assert [(w["path"]) for w in writes] == [
        "/api/v1/nodes/hot", "/api/v1/nodes/hot/status", "/api/v1/nodes/dead", "/api/v1/nodes/dead/status",
        "/api/v1/nodes/fine/status", "/api/v1/nodes/healed", "/api/v1/nodes/healed/status"]
    hot = writes[0]["body"]
    assert hot == {"metadata": {"resourceVersion": "1"},
                   "spec": {"taints": [FOREIGN, {"key": KEY, "value": "thermal", "effect": "PreferNoSchedule"}]}}
    assert taints(apiserver, "dead") == [{"key": KEY, "value": "xid", "effect": "NoSchedule"}]
    assert taints(apiserver, "healed") == [FOREIGN]  # ours removed, the foreign one kept
    assert taints(apiserver, "fine") == [] and taints(apiserver, "cpu-only") == []

    status = writes[3]["body"]
    assert list(status) == ["status"] and len(status["status"]["conditions"]) == 1  # only our condition is sent
    dead = condition(apiserver, "dead")
    assert (dead["status"], dead["reason"]) == ("True", "Drain")
    assert dead["message"] == "drain (capacity 0.00): xid: GPU 3 hardware XID 79 (GPU has fallen off the bus) (+1 more)"
    assert [c["type"] for c in apiserver.nodes["dead"]["status"]["conditions"]] == ["Ready", "LaggardStraggler"]  # Ready untouched
    assert (condition(apiserver, "fine")["status"], condition(apiserver, "fine")["reason"]) == ("False", "NoStraggler")
    healed = condition(apiserver, "healed")
    assert (healed["status"], healed["reason"], healed["lastTransitionTime"]) == ("True", "Rebalance", "2025-01-01T00:00:00Z")
    assert condition(apiserver, "cpu-only") is None

    apiserver.requests.clear()
    assert sync(apiserver, hints, "--apply") == 0  # in step already: nothing to write
    assert apiserver.writes() == []


def test_hints_clearing_removes_the_taint_and_flips_the_condition(apiserver, hints):
    assert sync(apiserver, hints, "--apply") == 0
    hints.doc = hint_doc(("hot", "ok", 1.0, []), ("dead", "drain", 0.0, [("xid", "GPU 3 XID 79")]))
    apiserver.requests.clear()
    assert sync(apiserver, hints, "--apply") == 0
    assert taints(apiserver, "hot") == [FOREIGN]
    hot = condition(apiserver, "hot")
    assert (hot["status"], hot["reason"], hot["message"]) == ("False", "NoStraggler", "no straggler")
    # Nodes the hints no longer mention lose the taint; their condition turns Unknown.
    assert taints(apiserver, "healed") == [FOREIGN]
    assert (condition(apiserver, "fine")["status"], condition(apiserver, "fine")["reason"]) == ("Unknown", "NoHints")
    assert taints(apiserver, "dead") == [{"key": KEY, "value": "xid", "effect": "NoSchedule"}]
    assert "/api/v1/nodes/dead" not in [w["path"] for w in apiserver.writes()]  # unchanged: no taint write


def test_a_conflict_is_retried_on_a_fresh_read_keeping_the_other_writers_taint(apiserver, hints):
    other = {"key": "example.com/maintenance", "value": "true", "effect": "NoSchedule"}
    apiserver.conflicts["dead"] = 1
    apiserver.concurrent_taint = other
    assert sync(apiserver, hints, "--apply") == 0
    paths = [(r["method"], r["path"]) for r in apiserver.requests if "dead" in r["path"]]
    assert paths == [("PATCH", "/api/v1/nodes/dead"), ("GET", "/api/v1/nodes/dead"), ("PATCH", "/api/v1/nodes/dead"),
                     ("PATCH", "/api/v1/nodes/dead/status")]
    assert taints(apiserver, "dead") == [other, {"key": KEY, "value": "xid", "effect": "NoSchedule"}]


def test_selector_and_cluster_are_passed_on(apiserver, hints):
    assert sync(apiserver, hints, "--selector", "kubernetes.io/hostname=dead", "--cluster", "prod", "--apply") == 0
    assert apiserver.requests[0]["query"] == {"labelSelector": ["kubernetes.io/hostname=dead"]}
    assert {w["path"] for w in apiserver.writes()} == {"/api/v1/nodes/dead", "/api/v1/nodes/dead/status"}
    assert hints.queries == ["/api/v1/hints?cluster=prod"]


def test_unreachable_hints_change_nothing(apiserver, capsys):
    assert laggard(["k8s-sync", "--server", "http://127.0.0.1:9", "--kube-api", apiserver.url, "--apply"]) == 1
    assert apiserver.requests == [] and "nothing changed" in capsys.readouterr().err


def test_no_cluster_to_talk_to_is_a_message_and_exit_2_not_a_traceback(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # not in a pod
    missing = tmp_path / "no-such-kubeconfig"
    assert laggard(["k8s-sync", "--server", "http://127.0.0.1:9", "--kubeconfig", str(missing)]) == 2
    err = capsys.readouterr().err
    assert "no Kubernetes API server" in err and "--kubeconfig" in err and "Traceback" not in err


PLAN_CASES = [
    # hint action, existing taints, expected taints after (None: untouched)
    ("avoid", [], [{"key": KEY, "value": "thermal", "effect": "PreferNoSchedule"}]),
    ("drain", [{"key": KEY, "value": "thermal", "effect": "PreferNoSchedule"}], [{"key": KEY, "value": "thermal", "effect": "NoSchedule"}]),
    ("drain", [{"key": KEY, "value": "thermal", "effect": "NoSchedule"}], None),
    ("rebalance", [{"key": KEY, "value": "thermal", "effect": "NoSchedule"}, FOREIGN], [FOREIGN]),
    ("ok", [FOREIGN], None),
    ("avoid", [{"key": KEY, "value": "a", "effect": "NoSchedule"}, {"key": KEY, "value": "b", "effect": "NoSchedule"}],
     [{"key": KEY, "value": "thermal", "effect": "PreferNoSchedule"}]),  # duplicates of ours collapse to one
]


@pytest.mark.parametrize(("action", "before", "after"), PLAN_CASES)
def test_taint_plan(action, before, after):
    hint = {"action": action, "capacity": 0.5, "cause": "thermal", "text": "thermal: hot"}
    plan = k8s_sync.plan_node(node("n", taints=before), hint, HintSettings(), now="2025-06-01T00:00:00Z")
    assert plan.taints_after == after


def test_taint_value_is_a_valid_label_value():
    hint = {"action": "drain", "capacity": 0.0, "cause": "weird cause/with*chars" + "x" * 80, "text": ""}
    value = k8s_sync.plan_node(node("n"), hint, HintSettings(), now="t").taints_after[0]["value"]
    assert len(value) <= 63 and value.startswith("weird_cause_with_chars")


def job_episode(gpu: int, cause: str, severity: str, job: tuple[str, str], finding: str, *, id: int) -> dict:
    """An open episode as the detector stores it on a GPU attributed to a Slurm job (issue #15):
    the summary led by the workload, evidence.job its name."""
    job_id, name = job
    workload = f"Slurm job {job_id} ({name})"
    return {"id": id, "cluster": "prod", "node": "shared", "gpu": gpu, "uuid": None, "cause": cause, "severity": severity,
            "onset": 100.0 + id, "detected_at": 100.0 + id, "resolved_at": None, "summary": f"{workload}: {finding}",
            "evidence": {"workload": workload, "job": name, "clock_deviation": -0.2}}


def test_condition_names_every_job_the_node_slows_as_the_drain_reason_does():
    """Issue #15: one node, two jobs (GPUs 0-3 llm-pretrain, 4-7 llm-finetune), a straggler in
    each. The taint stops new work for both, so the condition's message names both jobs: the one
    reason text slurm-sync drains with, not a second one."""
    episodes = [job_episode(5, "thermal", "critical", ("4102", "llm-finetune"), "GPU 5 HW thermal slowdown", id=1),
                job_episode(1, "clock", "warning", ("4101", "llm-pretrain"), "GPU 1 SM clock -20%", id=2)]
    doc = compute_hints(episodes, [KnownNode("prod", "shared", tuple((i, None) for i in range(8)))], {"prod": 200.0},
                        HintSettings(), generated_at=0.0)
    hint = by_node_name(doc)["shared"]
    plan = k8s_sync.plan_node(node("shared"), hint, HintSettings(), now="2025-06-01T00:00:00Z")
    assert plan.taints_after == [{"key": KEY, "value": "thermal", "effect": "PreferNoSchedule"}]  # a label value: the cause only
    message = plan.condition["message"]
    assert message == ("avoid (capacity 0.80): thermal: Slurm job 4102 (llm-finetune): GPU 5 HW thermal slowdown "
                       "(+1 more, also slowing job llm-pretrain)")
    assert message.endswith(slurm_sync.drain_reason(hint, HintSettings()).removeprefix("laggard: "))
