"""Peer groups that follow the jobs (issue #15 item 3): a GPU is compared with GPUs of the same
model running the same workload, as the agent attributed it; the node's labels decide only
where nothing is attributed. A job change is followed at once and is never a straggler."""

from __future__ import annotations

import time

import httpx
import pytest

from server.app import create_app
from server.detect.engine import Detector, NodeInstant
from server.detect.persistence import Opened
from server.detect.settings import DetectionSettings
from server.detect.source import LogCursor, load_instants, take_clusters
from server.peer_groups import peer_group, workload_key
from server.serve import start_in_thread
from server.settings import Settings
from server.store import episodes
from server.store.engine import make_engine
from tests.detect.test_engine import gpu_row
from tests.server.payloads import batch, encode

POD_KEY = "k8s:team-a/llm-a"
TRAIN, SERVE = "k8s:team-a/llm-a", "k8s:serving/llm-b"
SERVE_CLOCK = 1386  # 70% of 1980 MHz: what the inference job's power profile runs at, busy


@pytest.mark.parametrize(("kind", "fields", "key"), [
    ("k8s", dict(namespace="team-a", job="llm-a", pod="llm-a-worker-3", slurm_job_id=None), "k8s:team-a/llm-a"),
    ("k8s", dict(namespace="team-a", job=None, pod="notebook-7", slurm_job_id=None), "k8s:team-a/notebook-7"),
    ("slurm", dict(namespace=None, job="llm-b", pod=None, slurm_job_id="4242"), "slurm:4242"),
    ("process", dict(namespace=None, job=None, pod=None, slurm_job_id=None), None),
    ("idle", dict(namespace=None, job=None, pod=None, slurm_job_id=None), None),
    (None, dict(namespace=None, job=None, pod=None, slurm_job_id=None), None),
])
def test_workload_key(kind, fields, key):
    assert workload_key(kind, **fields) == key


def test_the_workload_decides_the_group_and_the_labels_only_without_one():
    labels = {"job": "from-the-label", "partition": "gpu"}
    assert peer_group(cluster="c", model="H100", labels=labels, workload=TRAIN) == f"c|H100|{TRAIN}"
    assert peer_group(cluster="c", model="H100", labels=labels, workload=None) == "c|H100|from-the-label"


def _fleet(*, attributed: bool, switch_at: float = 150.0) -> list[NodeInstant]:
    """Two nodes labelled with one job. GPUs 0-5 train; GPUs 6-7 of n0 train too until
    `switch_at`, then serve another job at 70% clock (busy); n1's GPUs 6-7 serve throughout."""
    items = []
    for ts in range(0, 300, 10):
        for node in ("n0", "n1"):
            rows = []
            for g in range(8):
                serving = g >= 6 and (node == "n1" or ts >= switch_at)
                row = gpu_row(node, g, float(ts), clock=SERVE_CLOCK if serving else 1980)
                if attributed:
                    row["workload"] = SERVE if serving else TRAIN
                rows.append(row)
            items.append(NodeInstant("c", node, {"job": "j"}, float(ts), rows, []))
    return items


def _opened_changes(items: list[NodeInstant]) -> list:
    # gpu_row's GPUs carry the SW power cap bit: a capped clock below capped peers opens at once
    # here (by default only after power_capped_open_after_s, longer than n0's 150 s of serving).
    det = Detector(DetectionSettings(open_after_s=0, power_capped_open_after_s=0))
    changes = []
    for item in items:
        det.add(item)
        changes += det.advance()
    return [c for c in changes if isinstance(c.change, Opened)]


def _opened(items: list[NodeInstant]) -> list[tuple[str, int, str]]:
    return sorted((c.node, c.gpu, c.cause) for c in _opened_changes(items))


def test_gpus_serving_another_job_are_not_stragglers_of_the_training_job():
    # By the node's label alone, the serving GPUs are slow trainers: that is the defect.
    assert {(node, gpu) for node, gpu, _ in _opened(_fleet(attributed=False))} == {("n0", 6), ("n0", 7), ("n1", 6), ("n1", 7)}
    # Attributed, they are peers of each other, and a GPU switching jobs mid-run opens nothing.
    assert _opened(_fleet(attributed=True)) == []


def test_a_slow_gpu_inside_its_own_job_is_still_found_and_named_by_its_job():
    items = _fleet(attributed=True)
    for item in items:
        for row in item.gpu_rows:
            serving = row["workload"] == SERVE
            row["workload_label"] = "job llm-b, pod llm-b-0" if serving else "job llm-a, pod llm-a-3"
            row["workload_job"] = "llm-b" if serving else "llm-a"
        if item.node == "n1" and item.ts >= 100:
            row = item.gpu_rows[2]
            row["sm_clock_mhz"], row["clocks_event_reasons"] = 1400, 0x40  # HW thermal slowdown
    opened = _opened_changes(items)
    assert {(c.node, c.gpu) for c in opened} == {("n1", 2)}
    # Whose job it slows comes first, as alerts, hints and drain reasons quote it.
    assert all(c.change.finding.summary.startswith("job llm-a, pod llm-a-3: GPU 2 ") for c in opened), [c.change.finding.summary for c in opened]
    assert all(c.change.finding.evidence["workload"] == "job llm-a, pod llm-a-3" for c in opened)
    assert all(c.change.finding.evidence["job"] == "llm-a" for c in opened)


def test_stragglers_filter_by_job(database_url):
    settings = Settings(database_url=database_url, detection_enabled=False, retention_interval_s=3600)
    server = start_in_thread(create_app(settings))
    engine = make_engine(settings.database_url)
    try:
        with engine.begin() as conn:
            for gpu, job in ((1, "llm-a"), (2, "llm-b"), (3, None)):
                evidence = {"job": job} if job else {}
                episodes.open_episode(conn, cluster="c", node="n1", gpu=gpu, uuid=f"GPU-{gpu}", entity=f"gpu:GPU-{gpu}", cause="clock",
                                      severity="warning", onset=100.0 + gpu, detected_at=101.0 + gpu, evidence=evidence, summary="s")

        def gpus(path: str, **params) -> list[int]:
            r = httpx.get(f"{server.url}/api/v1/stragglers{path}", params=params, timeout=30)
            assert r.status_code == 200, r.text
            return [e["gpu"] for e in r.json()["stragglers"]]

        assert gpus("", job="llm-a") == [1]
        assert gpus("", job="nobody") == []
        assert gpus("") == [1, 2, 3]
        assert gpus("/history", job="llm-b", since=0, until=1000) == [2]
    finally:
        server.stop()
        engine.dispose()


def test_stored_workloads_come_back_with_each_sample(database_url):
    """Pushed over HTTP, stored as changes, read back by the detector's source: each GPU row
    carries the workload in effect at its own instant, a change mid-batch included."""
    pod = {"kind": "k8s", "job": "llm-a", "namespace": "team-a", "pod": "llm-a-0", "processes": 1, "workloads": 1}
    slurm = {"kind": "slurm", "job": "eval", "slurm_job_id": "4242", "processes": 1, "workloads": 1}
    settings = Settings(database_url=database_url, detection_enabled=False, retention_interval_s=3600)
    server = start_in_thread(create_app(settings))
    engine = make_engine(settings.database_url)
    try:
        t0 = float(int(time.time()) - 120)
        first = batch(gpus=2, samples=3, ts=t0)
        for k, sample in enumerate(first["samples"]):
            sample["gpus"][0]["workload"] = pod
            sample["gpus"][1]["workload"] = pod if k < 2 else slurm  # GPU 1 changes job at its third sample
        second = batch(gpus=2, samples=2, ts=t0 + 3)  # an older agent's batch: nothing attributed, nothing stored
        for body in (first, second):
            content, headers = encode(body)
            assert httpx.post(f"{server.url}/api/v1/samples", content=content, headers=headers, timeout=30).status_code == 200
        with engine.connect() as conn:
            entries = take_clusters(conn, {"prod-a": LogCursor(low_water=0)})["prod-a"]
            items = load_instants(conn, entries)
    finally:
        server.stop()
        engine.dispose()
    got = [(item.ts - t0, [row.get("workload") for row in item.gpu_rows]) for item in items]
    # What a GPU last reported stays in effect until it reports a change (no row: unknown).
    assert got == [(0, [POD_KEY, POD_KEY]), (1, [POD_KEY, POD_KEY]), (2, [POD_KEY, "slurm:4242"]),
                   (3, [POD_KEY, "slurm:4242"]), (4, [POD_KEY, "slurm:4242"])]
    assert [row.get("workload_label") for row in items[-1].gpu_rows] == ["job llm-a, pod llm-a-0", "Slurm job 4242 (eval)"]
