"""GET /metrics on a live collector (SQLite and PostgreSQL): dcgm-exporter's names and labels from
each GPU's latest sample, Laggard's own series, counters that come from the database (so two
collector processes on one database agree, and retention does not make them fall), the switch
that turns the DCGM series off, and `promtool check metrics` on the output."""

from __future__ import annotations

import contextlib
import time

import httpx
import pytest
from sqlalchemy import delete, text

from server.app import create_app
from server.detect.settings import DetectionSettings
from server.metrics.settings import MetricsSettings
from server.serve import start_in_thread
from server.settings import Settings
from server.store import schema
from server.store.engine import make_engine
from tests.conftest import new_database_url
from tests.metrics.fleet import push, push_range
from tests.metrics.tools import promtool_check_metrics, samples, values

MIB = 1024 * 1024


def settings_for(url: str, **metrics) -> Settings:
    return Settings(database_url=url, detection=DetectionSettings(open_after_s=0, clear_after_s=0), detection_poll_s=0.05,
                    metrics=MetricsSettings(flush_interval_s=0.2, **metrics), retention_interval_s=3600)


def scrape(url: str) -> str:
    r = httpx.get(f"{url}/metrics", timeout=30)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return r.text


def wait_metric(url: str, name: str, timeout: float = 10.0, **labels) -> str:
    deadline = time.monotonic() + timeout
    while True:
        body = scrape(url)
        if values(body, name, **labels) or time.monotonic() > deadline:
            return body
        time.sleep(0.1)


@contextlib.contextmanager
def fed_collector(database_url: str):
    """A collector fed 12 instants of two 8-GPU nodes; n2's GPU 3 runs hot from instant 5, n1's
    GPU 2 reports XID 79 once."""
    t0 = float(int(time.time()) - 30)
    server = start_in_thread(create_app(settings_for(database_url)))
    try:
        push_range(server.url, t0, 0, 5, xid={"n1": 2})
        push_range(server.url, t0, 5, 12, hot={"n2": (3,)})
        wait_metric(server.url, "laggard_straggler_active", node="n2")
        yield server, database_url, t0
    finally:
        server.stop()


@pytest.fixture
def fleet_server(database_url):
    """fed_collector for a test that changes what it holds (pushes more, deletes or updates rows)."""
    with fed_collector(database_url) as fed:
        yield fed


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def read_only_fleet_server(request, tmp_path_factory):
    """fed_collector once per database for the tests that only read it (scrape it, start another
    collector on its database that only serves), the same as each of them had its own."""
    with new_database_url(request.param, tmp_path_factory.mktemp("fleet")) as url, fed_collector(url) as fed:
        yield fed


def test_dcgm_exporter_names_and_labels_from_the_latest_sample(read_only_fleet_server):
    server, _, t0 = read_only_fleet_server
    body = scrape(server.url)
    gpu0 = {"gpu": "0", "UUID": "GPU-n1-0", "device": "nvidia0", "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "n1",
            "cluster": "prod"}
    expected = {
        "DCGM_FI_DEV_GPU_TEMP": 60.0, "DCGM_FI_DEV_MEMORY_TEMP": 70.0, "DCGM_FI_DEV_SM_CLOCK": 1980, "DCGM_FI_DEV_MEM_CLOCK": 2619,
        "DCGM_FI_DEV_POWER_USAGE": 600.0, "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": 700.0, "DCGM_FI_DEV_GPU_UTIL": 99.0,
        # FB_USED leaves out the 512 MiB reserved, as dcgm-exporter's: FB_USED + FB_FREE + FB_RESERVED = 80 GiB.
        "DCGM_FI_DEV_MEM_COPY_UTIL": 40.0, "DCGM_FI_DEV_FB_USED": 60 * 1024 - 512, "DCGM_FI_DEV_FB_FREE": 20 * 1024,
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": 4, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 3, "DCGM_FI_DEV_PCIE_LINK_GEN": 5,
        "DCGM_FI_DEV_PCIE_LINK_WIDTH": 16, "DCGM_FI_DEV_PCIE_MAX_LINK_GEN": 5, "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH": 16,
        # Outside dcgm-exporter's default set and unused by the dashboards: only with dcgm_extra_series.
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": None, "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": None,
        # The latest sample (instant 11), not any earlier one: tx + rx bytes.
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": 2 * int(12 * 5e10), "DCGM_FI_DEV_XID_ERRORS": None,
    }
    for name, value in expected.items():
        got = values(body, name, **gpu0)
        if value is None:
            assert got == [], name
        else:
            assert got == [pytest.approx(value)], name
    # Exactly one series per GPU and field: 16 GPUs.
    assert len(values(body, "DCGM_FI_DEV_GPU_TEMP")) == 16
    assert values(body, "DCGM_FI_DEV_GPU_TEMP", Hostname="n2", gpu="3") == [91.0]
    assert values(body, "DCGM_FI_DEV_XID_ERRORS", Hostname="n1", gpu="2") == [79]
    # dcgm-exporter's ratio (0..1) from the percent on the wire; no series where it was null.
    assert values(body, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", **gpu0) == [pytest.approx(0.50)]
    assert values(body, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", Hostname="n2", gpu="3") == [pytest.approx(0.25)]
    assert values(body, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", gpu="7") == []
    assert len(values(body, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")) == 14
    assert "# TYPE DCGM_FI_PROF_PIPE_TENSOR_ACTIVE gauge" in body
    assert "# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER untyped" in body
    assert "# TYPE DCGM_FI_DEV_GPU_TEMP gauge" in body


def test_dcgm_exporter_default_series_added_for_issue_16(read_only_fleet_server):
    """Issue #16: the rest of dcgm-exporter's default set, in its units: the energy counter (mJ),
    encoder/decoder utilization (%), reserved framebuffer (MiB), row remap counts and failure, and
    the GPM ratios GR_ENGINE_ACTIVE and DRAM_ACTIVE (0..1, absent where the GPU sent null)."""
    server, _, t0 = read_only_fleet_server
    body = scrape(server.url)
    gpu0 = {"Hostname": "n1", "gpu": "0"}
    expected = {
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": int(1e9 + 11 * 600_000),  # the latest sample's counter
        "DCGM_FI_DEV_ENC_UTIL": 0.0, "DCGM_FI_DEV_DEC_UTIL": 5.0, "DCGM_FI_DEV_FB_RESERVED": 512,
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 0, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0, "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0,
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.97, "DCGM_FI_PROF_DRAM_ACTIVE": 0.40,
    }
    for name, value in expected.items():
        assert values(body, name, **gpu0) == [pytest.approx(value)], name
        assert len(values(body, name)) == (14 if name in ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE") else 16), name
    assert values(body, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", Hostname="n2", gpu="5") == [5]
    assert values(body, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", Hostname="n2", gpu="3") == [pytest.approx(0.60)]
    assert values(body, "DCGM_FI_PROF_DRAM_ACTIVE", gpu="7") == []
    used, free, reserved = (values(body, f"DCGM_FI_DEV_FB_{k}", **gpu0)[0] for k in ("USED", "FREE", "RESERVED"))
    assert used + free + reserved == 80 * 1024
    for name, kind in (("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "untyped"), ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "untyped"),
                       ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "untyped"), ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge"),
                       ("DCGM_FI_DEV_ENC_UTIL", "gauge"), ("DCGM_FI_DEV_DEC_UTIL", "gauge"), ("DCGM_FI_DEV_FB_RESERVED", "gauge"),
                       ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge"), ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge")):
        assert f"# TYPE {name} {kind}" in body, name


def test_an_agent_from_before_issue_16_gets_the_old_series_only(database_url):
    """An older agent sends none of the new readings: no new series for its GPUs, and FB_USED
    is its mem_used_bytes, as before."""
    t0 = float(int(time.time()) - 30)
    server = start_in_thread(create_app(settings_for(database_url)))
    try:
        payload = body_of_an_old_agent(t0)
        push(server.url, payload)
        scraped = wait_metric(server.url, "DCGM_FI_DEV_GPU_TEMP")
        assert values(scraped, "DCGM_FI_DEV_FB_USED", gpu="0") == [60 * 1024]
        for name in NEW_SERIES:
            assert values(scraped, name) == [], name
    finally:
        server.stop()


NEW_SERIES = ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL", "DCGM_FI_DEV_FB_RESERVED",
              "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
              "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE")


def body_of_an_old_agent(t0: float) -> dict:
    from tests.metrics.fleet import body

    payload = body("old", t0 + 10, t0, gpus=2)
    for gpu in payload["samples"][0]["gpus"]:
        for key in ("energy_mj_total", "util_enc_pct", "util_dec_pct", "mem_reserved_bytes", "remapped_rows_correctable_total",
                    "remapped_rows_uncorrectable_total", "remapped_rows_failure", "gr_engine_active_pct", "dram_active_pct"):
            del gpu[key]
    return payload


def test_dcgm_series_carry_each_nodes_exporter_labels(read_only_fleet_server):
    """Issue #16: to a dashboard built for dcgm-exporter, each node's per-GPU series look as if that
    node's own exporter served them: `instance` is the node (kept by the scrape job's
    honor_labels), with `Hostname` and `hostname`, `pci_bus_id`, `device` and
    `DCGM_FI_DRIVER_VERSION` from what the node's agent reported. Laggard's own series carry no
    `instance`, so they keep the collector's."""
    server, _, _ = read_only_fleet_server
    body = scrape(server.url)
    parsed = samples(body)
    n1_gpu0 = {"instance": "n1", "Hostname": "n1", "hostname": "n1", "gpu": "0", "UUID": "GPU-n1-0", "pci_bus_id": "00000000:18:00.0",
               "device": "nvidia0", "modelName": "NVIDIA H100 80GB HBM3", "DCGM_FI_DRIVER_VERSION": "550.54.15", "cluster": "prod",
               # No pod attributed to it: empty, which Prometheus stores as no label (issue #15).
               "namespace": "", "pod": "", "container": ""}
    assert [dict(labels) for name, labels in parsed if name == "DCGM_FI_DEV_GPU_TEMP" and dict(labels)["UUID"] == "GPU-n1-0"] == [n1_gpu0]
    # GPU 5 of each node: one series per node, told apart by instance.
    gpu5 = [dict(labels) for name, labels in parsed if name == "DCGM_FI_DEV_GPU_TEMP" and dict(labels)["gpu"] == "5"]
    assert sorted(s["instance"] for s in gpu5) == ["n1", "n2"]
    assert all(s["instance"] == s["Hostname"] == s["hostname"] and s["pci_bus_id"] == "00000000:1D:00.0" for s in gpu5)
    # Every DCGM family, the XID one included, carries the same labels.
    dcgm = [dict(labels) for name, labels in parsed if name.startswith("DCGM_FI_")]
    assert {name for name, _ in parsed if name.startswith("DCGM_FI_")} >= {"DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_SM_CLOCK"}
    assert all(set(s) == set(n1_gpu0) and s["instance"] == s["Hostname"] for s in dcgm)
    laggard = [dict(labels) for name, labels in parsed if not name.startswith("DCGM_FI_")]
    assert laggard and not any("instance" in s for s in laggard)
    # The scrape's `job` is left alone; job_name only names an attributed job (issue #15): none here.
    assert not any("job" in s for s in laggard) and all(s.get("job_name", "") == "" for s in laggard)


def test_dcgm_series_name_the_pod_using_the_gpu(database_url):
    """Issue #15: dcgm-exporter's `namespace`, `pod` and `container` labels, from the workload the
    node's agent attributed to each GPU; none for a GPU running no pod (a Slurm job, idle)."""
    from tests.metrics.fleet import body

    t0 = float(int(time.time()) - 30)
    server = start_in_thread(create_app(settings_for(database_url)))
    try:
        payload = body("n1", t0 + 10, t0, gpus=2)
        gpus = payload["samples"][0]["gpus"]
        gpus[0]["workload"] = {"kind": "k8s", "job": "llm-a", "namespace": "team-a", "pod": "llm-a-worker-3", "container": "trainer",
                               "processes": 1, "workloads": 1}
        gpus[1]["workload"] = {"kind": "slurm", "job": "eval", "slurm_job_id": "4242", "processes": 1, "workloads": 1}
        push(server.url, payload)
        scraped = wait_metric(server.url, "DCGM_FI_DEV_GPU_TEMP")
        labels = {dict(ls)["gpu"]: dict(ls) for name, ls in samples(scraped) if name == "DCGM_FI_DEV_GPU_TEMP"}
        assert (labels["0"]["namespace"], labels["0"]["pod"], labels["0"]["container"]) == ("team-a", "llm-a-worker-3", "trainer")
        assert (labels["1"]["namespace"], labels["1"]["pod"], labels["1"]["container"]) == ("", "", "")
    finally:
        server.stop()


def test_laggard_series_name_the_attributed_job(database_url):
    """Issue #15: Laggard's per-GPU series and its open episodes carry `job_name`, the job attributed to
    the GPU as the API's ?job= names it (a Kubernetes job, else the pod; a Slurm job's name, else
    its id); empty (no label) for a GPU nothing is attributed to."""
    from tests.metrics.fleet import body

    slurm = {"kind": "slurm", "job": "llm-b", "slurm_job_id": "4242", "processes": 1, "workloads": 1}
    t0 = float(int(time.time()) - 30)
    server = start_in_thread(create_app(settings_for(database_url)))
    try:
        for k in range(12):
            for node in ("n1", "n2"):
                payload = body(node, t0 + k, t0, hot_gpus=(3,) if node == "n2" and k >= 5 else ())
                for gpu in payload["samples"][0]["gpus"]:
                    gpu["workload"] = slurm  # one Slurm job over both nodes but two GPUs of n1
                if node == "n1":
                    gpus = payload["samples"][0]["gpus"]
                    gpus[0]["workload"] = {"kind": "k8s", "job": "llm-a", "namespace": "team-a", "pod": "llm-a-worker-3",
                                           "container": "trainer", "processes": 1, "workloads": 1}
                    gpus[1]["workload"] = {"kind": "k8s", "namespace": "team-a", "pod": "notebook-7", "processes": 1, "workloads": 1}
                    del gpus[2]["workload"]
                push(server.url, payload)
        scraped = wait_metric(server.url, "laggard_straggler_active", node="n2")
        assert values(scraped, "laggard_straggler_active", node="n2", gpu="3", job_name="llm-b") == [1]
        jobs = {(dict(ls)["node"], dict(ls)["gpu"]): dict(ls).get("job_name") for name, ls in samples(scraped)
                if name == "laggard_gpu_capacity_ratio"}
        assert jobs[("n1", "0")] == "llm-a" and jobs[("n1", "1")] == "notebook-7" and jobs[("n1", "2")] == ""
        assert {jobs[("n1", str(i))] for i in range(3, 8)} == {jobs[("n2", str(i))] for i in range(8)} == {"llm-b"}
        assert values(scraped, "laggard_gpu_capacity_ratio", node="n2", gpu="3", job_name="llm-b")[0] < 0.8
        for family in ("laggard_gpu_sm_clock_ratio", "laggard_gpu_lost", "laggard_gpu_nvlink_links_up"):
            assert values(scraped, family, node="n1", gpu="0", job_name="llm-a"), family
        # The DCGM series keep dcgm-exporter's labels: the pod, no job_name.
        dcgm = [dict(ls) for name, ls in samples(scraped) if name == "DCGM_FI_DEV_GPU_TEMP"]
        assert dcgm and not any("job_name" in s or "job" in s for s in dcgm)
    finally:
        server.stop()


def test_peer_deviation_compares_a_gpu_within_its_job_only(database_url):
    """Issue #15: laggard_gpu_peer_deviation_ratio groups as the detector does, by model and the
    attributed job. Two Slurm jobs share two nodes with one `job` label (GPUs 0-3: 4101 at full
    clock; 4-7: 4102, power-capped at ~1500 MHz, one of its GPUs at 1200): every GPU is compared
    with its own job's, so the capped job's GPUs sit at 0 and only its slow GPU deviates."""
    from tests.metrics.fleet import body

    fast = {"kind": "slurm", "job": "llm-pretrain", "slurm_job_id": "4101", "processes": 1, "workloads": 1}
    capped = {"kind": "slurm", "job": "llm-finetune", "slurm_job_id": "4102", "processes": 1, "workloads": 1}
    t0 = float(int(time.time()) - 30)
    server = start_in_thread(create_app(settings_for(database_url)))
    try:
        for node in ("n1", "n2"):
            payload = body(node, t0 + 10, t0)
            for gpu in payload["samples"][0]["gpus"]:
                on_capped = gpu["index"] >= 4
                gpu["workload"] = capped if on_capped else fast
                if on_capped:
                    gpu["sm_clock_mhz"] = 1200 if (node, gpu["index"]) == ("n2", 6) else 1500
            push(server.url, payload)
        scraped = wait_metric(server.url, "laggard_gpu_peer_deviation_ratio")

        def deviation(node: str, gpu: int) -> float:
            return values(scraped, "laggard_gpu_peer_deviation_ratio", node=node, gpu=str(gpu))[0]

        for node in ("n1", "n2"):
            for index in range(8):
                if (node, index) != ("n2", 6):
                    # Grouped by the label alone, the median falls between the jobs: +14% for 4101's GPUs.
                    assert deviation(node, index) == pytest.approx(0.0, abs=0.005), (node, index)
        assert deviation("n2", 6) == pytest.approx(1200 / 1500 - 1)
    finally:
        server.stop()


def test_laggard_series(read_only_fleet_server):
    server, url, t0 = read_only_fleet_server
    body = wait_metric(server.url, "laggard_gpu_xid_errors_total")
    hot = {"cluster": "prod", "node": "n2", "gpu": "3"}
    assert values(body, "laggard_straggler_active", cause="thermal", **hot) == [1]
    assert values(body, "laggard_straggler_active", node="n1") == []  # its XID 79 episode opened and resolved at once
    assert values(body, "laggard_gpu_sm_clock_ratio", **hot) == [pytest.approx(1400 / 1980)]
    # Peers: the 15 other busy H100s of job llm; median ratio (1980 - i)/1980.
    deviation = values(body, "laggard_gpu_peer_deviation_ratio", **hot)[0]
    assert -0.31 < deviation < -0.28
    assert values(body, "laggard_gpu_peer_deviation_ratio", node="n1", gpu="0")[0] == pytest.approx(0.0, abs=0.005)
    assert values(body, "laggard_gpu_capacity_ratio", **hot)[0] < 0.8
    assert values(body, "laggard_gpu_capacity_ratio", node="n1", gpu="0") == [1.0]
    for node in ("n1", "n2"):  # one action per node, not "ok" (n1: the XID's hint lasts its cool-down)
        assert sum(values(body, "laggard_node_action", node=node)) == 1
        assert values(body, "laggard_node_action", node=node, action="ok") == [0]
    assert values(body, "laggard_nodes_reporting", cluster="prod") == [2]
    assert values(body, "laggard_nodes_stale", cluster="prod") == [0]
    assert values(body, "laggard_node_last_seen_timestamp_seconds", node="n1") == [t0 + 11]
    assert values(body, "laggard_gpu_nvlink_links_up", node="n1", gpu="0") == [18]
    assert values(body, "laggard_nic_port_up", node="n1", device="mlx5_0", port="1") == [1]
    assert values(body, "laggard_nic_link_rate_bytes_per_second", node="n1") == [400e9 / 8]
    assert values(body, "laggard_episodes_opened_total", cluster="prod", cause="thermal") == [1]
    assert values(body, "laggard_gpu_xid_errors_total", node="n1", gpu="2", xid="79") == [1]
    assert values(body, "laggard_gpu_xid_last_timestamp_seconds", cluster="prod", node="n1", gpu="2", xid="79") == [t0]
    assert values(body, "laggard_gpu_xid_last_timestamp_seconds", node="n2") == []
    assert values(body, "laggard_detection_lag_seconds", cluster="prod")[0] >= 0
    assert values(body, "laggard_detection_backlog_batches") != []
    body = wait_ingest(server.url, 24)
    assert values(body, "laggard_ingest_samples_total", cluster="prod") == [24]
    assert values(body, "laggard_ingest_batches_total", cluster="prod") == [24]
    assert values(body, "laggard_ingest_request_duration_seconds_count") == [24]
    assert values(body, "laggard_ingest_request_duration_seconds_bucket", le="+Inf") == [24]


def wait_ingest(url: str, n: int, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        body = scrape(url)
        if (values(body, "laggard_ingest_samples_total", cluster="prod") == [n]
                and values(body, "laggard_ingest_request_duration_seconds_count") == [n]) or time.monotonic() > deadline:
            return body
        time.sleep(0.1)


def test_counters_survive_retention_and_resolve(fleet_server):
    server, url, t0 = fleet_server
    wait_metric(server.url, "laggard_gpu_xid_errors_total")
    wait_ingest(server.url, 24)
    engine = make_engine(url)
    try:
        with engine.begin() as conn:  # what retention does to old rows
            conn.execute(delete(schema.XidEvent.__table__))
            conn.execute(delete(schema.IngestLog.__table__))
    finally:
        engine.dispose()
    push_range(server.url, t0, 12, 20)  # n2 cools down: the episode resolves
    body = wait_metric(server.url, "laggard_episodes_resolved_total", cause="thermal")
    assert values(body, "laggard_episodes_resolved_total", cluster="prod", cause="thermal") == [1]
    assert values(body, "laggard_straggler_active", node="n2") == []
    assert values(body, "laggard_gpu_xid_errors_total", node="n1", gpu="2", xid="79") == [1]
    body = wait_ingest(server.url, 40)
    assert values(body, "laggard_ingest_samples_total", cluster="prod") == [40]


def test_two_collectors_on_one_database_agree(fleet_server):
    server, url, t0 = fleet_server
    second = start_in_thread(create_app(settings_for(url, process_series=False)))
    try:
        bad = httpx.post(f"{second.url}/api/v1/samples", content=b'{"version": 1}', headers={"content-type": "application/json"})
        assert bad.status_code == 422
        assert httpx.post(f"{server.url}/api/v1/samples", content=b"{", headers={"content-type": "application/json"}).status_code == 400
        moving = ("process_", "python_", "laggard_detection_lag_seconds", "laggard_alert_oldest_pending_age_seconds")
        # Each process flushes its own counts to the database every so often: the two agree
        # once both flushes are in (the two scrapes are not taken at the same instant either).
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            a, b = scrape(server.url), scrape(second.url)
            same_a = {k: v for k, v in samples(a).items() if not k[0].startswith(moving)}
            same_b = {k: v for k, v in samples(b).items() if not k[0].startswith(moving)}
            if values(b, "laggard_ingest_rejected_requests_total", code="422") == [1] and \
                    values(a, "laggard_ingest_rejected_requests_total", code="400") == [1] and same_a == same_b:
                break
            time.sleep(0.1)
        assert same_a == same_b
        assert values(a, "laggard_ingest_rejected_requests_total", code="422") == [1]  # counted by the other process
        assert values(b, "laggard_ingest_rejected_requests_total", code="400") == [1]
        assert not any(k[0].startswith("process_") for k in samples(b))
    finally:
        second.stop()


def test_dcgm_extra_series(sqlite_url):
    t0 = float(int(time.time()) - 30)
    server = start_in_thread(create_app(settings_for(sqlite_url, dcgm_extra_series=True)))
    try:
        push_range(server.url, t0, 0, 2)
        body = wait_metric(server.url, "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL")
        gpu0 = {"Hostname": "n1", "gpu": "0"}
        assert values(body, "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", **gpu0) == [5]
        assert values(body, "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", **gpu0) == [0]
        assert values(body, "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", **gpu0) == [2]
        assert values(body, "DCGM_FI_PROF_PCIE_RX_BYTES", **gpu0) == [2e9]
        assert values(body, "DCGM_FI_DEV_ROW_REMAP_PENDING", **gpu0) == [0]
        assert values(body, "DCGM_FI_DEV_MAX_SM_CLOCK", **gpu0) == [1980]
    finally:
        server.stop()


def test_dcgm_switch_off(database_url):
    t0 = float(int(time.time()) - 30)
    server = start_in_thread(create_app(settings_for(database_url, dcgm_series=False)))
    try:
        push_range(server.url, t0, 0, 3, xid={"n1": 2})
        body = wait_metric(server.url, "laggard_gpu_sm_clock_ratio")
        assert "DCGM_" not in body
        assert len(values(body, "laggard_gpu_sm_clock_ratio")) == 16
    finally:
        server.stop()


def test_old_samples_are_not_exported(database_url):
    t0 = float(int(time.time()) - 3600)
    server = start_in_thread(create_app(settings_for(database_url)))
    try:
        push_range(server.url, t0, 0, 2)
        body = scrape(server.url)
        assert values(body, "DCGM_FI_DEV_GPU_TEMP") == []  # older than max_sample_age_s: the node is gone
        assert values(body, "laggard_nodes_stale", cluster="prod") == [2]
        assert values(body, "laggard_nodes_reporting", cluster="prod") == [0]
    finally:
        server.stop()


def test_metrics_can_be_turned_off(sqlite_url):
    server = start_in_thread(create_app(settings_for(sqlite_url, enabled=False)))
    try:
        assert httpx.get(f"{server.url}/metrics").status_code == 404
    finally:
        server.stop()


def test_promtool_check_metrics_passes(read_only_fleet_server):
    """Laggard's own series pass promtool's lint, and so does the whole output with the DCGM
    switch off. With it on, promtool reports two things that are dcgm-exporter's own naming (its
    output draws the same findings): the camelCase label `modelName`, and "COUNTER" inside the
    name DCGM_FI_DEV_PCIE_REPLAY_COUNTER. Nothing else."""
    server, url, _ = read_only_fleet_server
    wait_metric(server.url, "laggard_gpu_xid_errors_total")
    body = scrape(server.url)
    rc, problems = promtool_check_metrics(body)
    camel = "label names should be written in 'snake_case' not 'camelCase'"
    assert any(line.endswith(camel) for line in problems), "expected the modelName finding"
    for line in problems:
        assert (line.startswith("DCGM_FI_") and line.endswith(camel)) or \
            line == "DCGM_FI_DEV_PCIE_REPLAY_COUNTER metric name should not include type 'counter'", line
    laggard_only = "".join(chunk for chunk in _families(body) if "DCGM_FI_" not in chunk)
    rc, problems = promtool_check_metrics(laggard_only)
    assert (rc, problems) == (0, [])
    off = start_in_thread(create_app(settings_for(url, dcgm_series=False)))
    try:
        rc, problems = promtool_check_metrics(scrape(off.url))
        assert (rc, problems) == (0, [])
    finally:
        off.stop()


def _families(body: str) -> list[str]:
    chunks, current = [], []
    for line in body.splitlines(keepends=True):
        if line.startswith("# HELP") and current:
            chunks.append("".join(current))
            current = []
        current.append(line)
    chunks.append("".join(current))
    return chunks


def test_scrape_reads_the_database_not_process_memory(fleet_server):
    """Rows written behind the collector's back show up at the next scrape."""
    server, url, _ = fleet_server
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("UPDATE episodes SET resolved_at = onset + 1"))
    finally:
        engine.dispose()
    assert values(scrape(server.url), "laggard_straggler_active") == []
