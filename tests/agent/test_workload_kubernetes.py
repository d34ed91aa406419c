"""agent/workload/kubernetes.py: the job of a pod from its labels and owners, and KubePods against
a real local HTTP server answering this node's PodList (cache, re-list interval, failures)."""

from __future__ import annotations

import pytest

from agent.workload.kubernetes import KubePods, PodInfo, api_server_pods_url, in_cluster_api, job_of, pods_from_list
from tests.agent.pod_server import PodServer, pod

UID_A = "6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b"
UID_B = "11111111-2222-4333-8444-555555555555"
CID_A = "a" * 64
CID_B = "b" * 64


def _owner(kind: str, name: str, controller: bool = True) -> dict:
    return {"apiVersion": "batch/v1", "kind": kind, "name": name, "uid": "x", "controller": controller, "blockOwnerDeletion": True}


@pytest.mark.parametrize("meta, job", [
    ({"labels": {"batch.kubernetes.io/job-name": "pi", "job-name": "pi"}, "ownerReferences": [_owner("Job", "pi")]}, "pi"),
    ({"labels": {"job-name": "old-style"}}, "old-style"),
    # a JobSet's pods also carry their child Job's label: the JobSet wins
    ({"labels": {"jobset.sigs.k8s.io/jobset-name": "llama-70b", "batch.kubernetes.io/job-name": "llama-70b-workers-0"},
      "ownerReferences": [_owner("Job", "llama-70b-workers-0")]}, "llama-70b"),
    ({"labels": {"training.kubeflow.org/job-name": "bert-ft", "training.kubeflow.org/replica-type": "worker"},
      "ownerReferences": [_owner("PyTorchJob", "bert-ft")]}, "bert-ft"),
    ({"labels": {"volcano.sh/job-name": "resnet"}}, "resnet"),
    ({"annotations": {"volcano.sh/job-name": "resnet-ann"}}, "resnet-ann"),
    ({"labels": {"leaderworkerset.sigs.k8s.io/name": "vllm-405b"}}, "vllm-405b"),
    # no job label: the controller owner; a Deployment's ReplicaSet hash is taken off
    ({"labels": {"pod-template-hash": "7d9f8c6b5"}, "ownerReferences": [_owner("ReplicaSet", "triton-7d9f8c6b5")]}, "triton"),
    ({"ownerReferences": [_owner("StatefulSet", "ray-workers")]}, "ray-workers"),
    ({"ownerReferences": [_owner("Job", "not-controller", controller=False)], "labels": {"app.kubernetes.io/instance": "release-1"}},
     "release-1"),
    ({"labels": {"app.kubernetes.io/instance": "release-1"}}, "release-1"),
    ({"labels": {"app": "x"}}, None),
    ({}, None),
])
def test_job_of(meta, job):
    assert job_of(meta) == job


def test_pods_from_list_maps_container_ids_of_every_runtime_and_static_pods():
    body = {"items": [
        pod("train-0", UID_A, namespace="ml", labels={"job-name": "train"}, containers={"trainer": CID_A, "sidecar": CID_B}),
        pod("infer-0", UID_B, containers={"server": "c" * 64}, scheme="cri-o"),
        pod("dcgm-node-1", "mirror-uid", namespace="kube-system", annotations={"kubernetes.io/config.mirror": "0f" * 16},
            containers={"dcgm": "d" * 64}, scheme="docker"),
        {"metadata": {"name": "no-uid"}},
    ]}
    pods = pods_from_list(body)
    assert pods[UID_A] == PodInfo(UID_A, "ml", "train-0", "train", {CID_A: "trainer", CID_B: "sidecar"})
    assert pods[UID_B].containers == {"c" * 64: "server"}
    assert pods["0f" * 16] is pods["mirror-uid"] and pods["mirror-uid"].containers == {"d" * 64: "dcgm"}
    assert len(pods) == 4


def test_urls():
    assert api_server_pods_url("https://10.96.0.1:443/", "gpu-1.example") == \
        "https://10.96.0.1:443/api/v1/pods?fieldSelector=spec.nodeName%3Dgpu-1.example&resourceVersion=0"
    assert in_cluster_api({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}) == "https://10.96.0.1:443"
    assert in_cluster_api({"KUBERNETES_SERVICE_HOST": "fd00::1"}) == "https://[fd00::1]:443"
    assert in_cluster_api({}) is None
    assert KubePods.in_cluster("gpu-1", env={}) is None


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def token(tmp_path):
    path = tmp_path / "token"
    path.write_text("t0k3n\n")
    return path


def _pods(server: PodServer, token, clock: Clock, **kw) -> KubePods:
    return KubePods(server.pods_url("gpu-1"), token_file=token, clock=clock, background=False, **kw)


def test_lookup_lists_this_nodes_pods_once_with_the_token(token):
    clock = Clock()
    with PodServer([pod("train-0", UID_A, namespace="ml", labels={"job-name": "train"}, containers={"trainer": CID_A}),
                    pod("elsewhere", UID_B, node="gpu-2")]) as server:
        pods = _pods(server, token, clock)
        try:
            assert pods.lookup(UID_A) == PodInfo(UID_A, "ml", "train-0", "train", {CID_A: "trainer"})
            clock.t += 1
            assert pods.lookup(UID_A).name == "train-0"  # from the cache
            assert pods.lookup(UID_B) is None  # another node's pod is not in this node's list
        finally:
            pods.close()
    assert len(server.requests) == 1
    r = server.requests[0]
    assert r["path"] == "/api/v1/pods" and r["authorization"] == "Bearer t0k3n"
    assert r["query"] == {"fieldSelector": ["spec.nodeName=gpu-1"], "resourceVersion": ["0"]}
    assert pods.errors == {"k8s_list_failed": 0, "k8s_pod_unknown": 1} and pods.lists == 1


def test_unknown_pod_relists_at_most_every_min_relist_s_and_refresh_s_renews(token):
    clock = Clock()
    with PodServer([]) as server:
        pods = _pods(server, token, clock, min_relist_s=5.0, refresh_s=60.0)
        try:
            assert pods.lookup(UID_A) is None  # lists: nothing there yet
            server.pods.append(pod("new-0", UID_A))
            clock.t += 2
            assert pods.lookup(UID_A) is None  # too soon to list again
            assert len(server.requests) == 1
            clock.t += 3
            assert pods.lookup(UID_A).name == "new-0"  # 5 s after the last list: listed again
            assert len(server.requests) == 2
            clock.t += 30
            pods.lookup(UID_A)
            assert len(server.requests) == 2  # known and fresh: no list
            clock.t += 30
            server.pods[0]["metadata"]["labels"] = {"job-name": "relabelled"}
            assert pods.lookup(UID_A).job == "relabelled"  # 60 s old: refreshed
            assert len(server.requests) == 3
        finally:
            pods.close()
    assert pods.errors == {"k8s_list_failed": 0, "k8s_pod_unknown": 2}


def test_a_failed_list_is_counted_and_keeps_the_previous_pods(token):
    clock = Clock()
    with PodServer([pod("train-0", UID_A)]) as server:
        pods = _pods(server, token, clock, refresh_s=10.0)
        try:
            assert pods.lookup(UID_A).name == "train-0"
            server.status = 500
            clock.t += 10
            assert pods.lookup(UID_A).name == "train-0"  # the list failed; the old answer stands
            assert pods.lookup(UID_B) is None
            assert pods.errors == {"k8s_list_failed": 1, "k8s_pod_unknown": 1}
            server.status = 200
            clock.t += 5
            server.pods.append(pod("b-0", UID_B))
            assert pods.lookup(UID_B).name == "b-0"
        finally:
            pods.close()


def test_bad_token_unreachable_server_and_bad_json_are_counted(tmp_path, token):
    clock = Clock()
    with PodServer([pod("train-0", UID_A)], token="other") as server:
        pods = _pods(server, token, clock)
        assert pods.lookup(UID_A) is None and pods.errors["k8s_list_failed"] == 1  # 401
        server.token = None
        (tmp_path / "token").unlink()
        clock.t += 5
        assert pods.lookup(UID_A) is None and pods.errors["k8s_list_failed"] == 2  # token file gone
        url = server.pods_url()
    pods.close()
    gone = KubePods(url, clock=clock, background=False, timeout_s=2)
    assert gone.lookup(UID_A) is None and gone.errors["k8s_list_failed"] == 1  # connection refused
    gone.close()
    with PodServer([], token=None) as server:
        weird = KubePods(server.url + "/not-pods", clock=clock, background=False)
        assert weird.lookup(UID_A) is None and weird.errors["k8s_list_failed"] == 1  # 404
        weird.close()


def test_token_is_read_again_for_each_list(token):
    clock = Clock()
    with PodServer([pod("train-0", UID_A)]) as server:
        pods = _pods(server, token, clock)
        try:
            pods.lookup(UID_A)
            server.token = "rotated"
            token.write_text("rotated")
            clock.t += 5
            assert pods.lookup(UID_B) is None
        finally:
            pods.close()
    assert [r["authorization"] for r in server.requests] == ["Bearer t0k3n", "Bearer rotated"]
    assert pods.errors["k8s_list_failed"] == 0


def test_background_list_never_blocks_the_lookup(token):
    with PodServer([pod("train-0", UID_A)]) as server:
        pods = KubePods(server.pods_url(), token_file=token)  # background worker, real clock
        try:
            first = pods.lookup(UID_A)  # answered at once from the (empty) cache, or just listed
            assert pods.wait_idle(10)
            assert pods.lookup(UID_A).name == "train-0"
            assert first is None or first.name == "train-0"
        finally:
            pods.close()
    assert len(server.requests) == 1


def test_https_with_a_ca_file_that_is_missing_or_not_a_certificate(tmp_path):
    bad = tmp_path / "ca.crt"
    bad.write_text("not a certificate")
    for ca in (bad, tmp_path / "missing.crt"):
        pods = KubePods("https://127.0.0.1:9/api/v1/pods", ca_file=ca, background=False, timeout_s=1)
        assert pods.lookup("x") is None and pods.errors["k8s_list_failed"] == 1
        pods.close()
