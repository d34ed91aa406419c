"""`laggard-agent --metrics-port`: the node's own latest readings, written without
prometheus_client (the agent ships with nvidia-ml-py and httpx only)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from agent.cli import parse_config
from agent.metrics import NodeMetrics, parse_listen
from agent.sample import GpuSample, NicSample, Sample, XidEvent
from tests.metrics.tools import free_port, promtool_check_metrics, samples, values

REPO = Path(__file__).resolve().parents[2]


class Sink:
    def __init__(self):
        self.got = []

    def submit(self, sample):
        self.got.append(sample)


def sample(ts: float) -> Sample:
    gpus = [GpuSample(index=i, uuid=f"GPU-{i}", model="NVIDIA H100 80GB HBM3", pci_bus_id=f"00000000:{0x18 + i:02X}:00.0",
                      temp_c=60.0 + i, sm_clock_mhz=1980, sm_clock_max_mhz=1980, mem_used_bytes=2 * 2**20, mem_total_bytes=10 * 2**20,
                      pcie_replay_total=4, nvlink_tx_bytes_total=100, nvlink_rx_bytes_total=50,
                      tensor_active_pct=62.5 if i == 0 else None,  # GPU 1: no GPM reading
                      xids=[XidEvent(79, ts)] if i == 1 else []) for i in range(2)]
    gpus.append(GpuSample(index=2, uuid="GPU-2", lost=True))
    return Sample(ts=ts, gpus=gpus, nics=[NicSample("mlx5_0", 1, state="ACTIVE", rate_gbps=400.0, tx_bytes_total=10)])


def test_node_metrics_tee_and_exposition():
    sink = Sink()
    metrics = NodeMetrics(sink, node="n1", cluster="prod", driver="550.54.15",
                          stats=lambda: {"sent_samples": 5, "rejected_samples": 0, "failed_attempts": 2, "dropped": 0, "queued": 1})
    s = sample(1000.0)
    metrics.submit(s)
    assert sink.got == [s]
    text = metrics.exposition()
    labels = {"gpu": "0", "UUID": "GPU-0", "device": "nvidia0", "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "n1",
              "cluster": "prod"}
    assert values(text, "DCGM_FI_DEV_GPU_TEMP", **labels) == [60.0]
    assert values(text, "DCGM_FI_DEV_FB_FREE", **labels) == [8.0]
    assert values(text, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", **labels) == [150]
    assert values(text, "DCGM_FI_DEV_XID_ERRORS", gpu="1") == [79]
    assert values(text, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", **labels) == [0.625]  # a ratio, as dcgm-exporter's
    assert values(text, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", gpu="1") == []
    assert values(text, "DCGM_FI_DEV_GPU_TEMP", gpu="2") == []  # lost: no readings
    assert values(text, "laggard_gpu_lost", gpu="2") == [1]
    assert values(text, "laggard_gpu_xid_errors_total", gpu="1", xid="79") == [1]
    assert values(text, "laggard_nic_port_up", device="mlx5_0", port="1") == [1]
    assert values(text, "laggard_agent_push_failures_total") == [2]
    assert values(text, "laggard_agent_last_sample_timestamp_seconds") == [1000.0]
    metrics.submit(sample(1005.0))  # the XID counter counts events, the gauge keeps the last
    text = metrics.exposition()
    assert values(text, "laggard_gpu_xid_errors_total", gpu="1", xid="79") == [2]
    assert values(text, "laggard_agent_samples_total") == [2]
    rc, problems = promtool_check_metrics(text)
    for line in problems:  # dcgm-exporter's own naming, as on the collector (tests/metrics/test_collector.py)
        assert line.startswith("DCGM_FI_") and ("camelCase" in line or "should not include type 'counter'" in line), line


def test_dcgm_labels_as_dcgm_exporter_writes_them():
    """Issue #16: the agent is the node's own exporter, so its DCGM series carry dcgm-exporter's
    labels, `Hostname` and `hostname` both, the PCI bus id and the driver version, and no
    `instance`: Prometheus gives them the agent's address, as it gives dcgm-exporter's."""
    metrics = NodeMetrics(None, node="n1", cluster="prod", driver="550.54.15")
    metrics.submit(sample(1000.0))
    parsed = samples(metrics.exposition())
    gpu1 = {"gpu": "1", "UUID": "GPU-1", "pci_bus_id": "00000000:19:00.0", "device": "nvidia1", "modelName": "NVIDIA H100 80GB HBM3",
            "Hostname": "n1", "hostname": "n1", "DCGM_FI_DRIVER_VERSION": "550.54.15", "cluster": "prod"}
    for name in ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_XID_ERRORS"):
        assert [dict(labels) for n, labels in parsed if n == name and dict(labels)["gpu"] == "1"] == [gpu1], name


def test_the_agents_own_endpoint_serves_the_issue_16_series_from_a_simulated_h100():
    """Issue #16, on the node: the simulated H100's readings through the real readers, as
    dcgm-exporter's default series; the GPM ratios from the second sampling cycle on."""
    from agent.nvml.source import NvmlGpuSource
    from agent.sim.gpu import SimNode
    from agent.sim.install import install_simulated_nvml
    from agent.sim.libnvml import SimNvmlLib

    node = SimNode("sim-h100", "h100", 2, workload="busy", seed=3)
    metrics = NodeMetrics(None, node="sim-h100", cluster="lab", driver=node.driver_version)
    with install_simulated_nvml(SimNvmlLib(node)), NvmlGpuSource() as src:
        for ts in (1000.0, 1005.0):
            node.advance(ts)
            metrics.submit(Sample(ts=ts, gpus=src.read(ts)))
    text = metrics.exposition()
    gpu = node.gpus[1]
    got = {name: values(text, name, gpu="1") for name in (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL", "DCGM_FI_DEV_FB_RESERVED",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE")}
    assert got == {
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": [int(gpu.counters.energy_mj)], "DCGM_FI_DEV_ENC_UTIL": [0.0],
        "DCGM_FI_DEV_DEC_UTIL": [0.0], "DCGM_FI_DEV_FB_RESERVED": [551.0], "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": [0],
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": [0], "DCGM_FI_DEV_ROW_REMAP_FAILURE": [0],
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": [pytest.approx(gpu.state.gr_engine_active_pct / 100)],
        "DCGM_FI_PROF_DRAM_ACTIVE": [pytest.approx(gpu.state.dram_active_pct / 100)],
    }
    assert 0.9 < got["DCGM_FI_PROF_GR_ENGINE_ACTIVE"][0] <= 1.0 and 0.2 < got["DCGM_FI_PROF_DRAM_ACTIVE"][0] < 0.7


def test_empty_before_the_first_sample():
    text = NodeMetrics(None, node="n1", cluster="c").exposition()
    assert "DCGM_FI_DEV_GPU_TEMP" in text and values(text, "DCGM_FI_DEV_GPU_TEMP") == []


def test_listen_spec():
    assert parse_listen("9400") == ("0.0.0.0", 9400)
    assert parse_listen("127.0.0.1:9400") == ("127.0.0.1", 9400)
    assert parse_listen("[::1]:9400") == ("::1", 9400)
    for bad in ("x", "1:2:x", "70000"):
        with pytest.raises(ValueError):
            parse_listen(bad)


def test_cli_flag_and_env():
    assert parse_config([], env={}).metrics_port is None
    assert parse_config(["--metrics-port", "9400"], env={}).metrics_port == "9400"
    assert parse_config([], env={"LAGGARD_METRICS_PORT": "127.0.0.1:9401"}).metrics_port == "127.0.0.1:9401"
    with pytest.raises(SystemExit):
        parse_config(["--metrics-port", "nope"], env={})


def test_the_agent_imports_neither_the_server_nor_prometheus_client():
    code = ("import sys, agent.cli, agent.metrics; bad = [m for m in sys.modules if m == 'prometheus_client' or m == 'server' "
            "or m.startswith(('prometheus_client.', 'server.', 'fastapi', 'sqlalchemy'))]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)


def test_agent_serves_metrics_while_the_collector_is_away():
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent.cli", "--simulate", "H100:2", "--fault", "gpu1:thermal", "--interval", "0.5",
         "--collector", f"http://127.0.0.1:{free_port()}", "--node", "sim-1", "--cluster", "lab", "--metrics-port", f"127.0.0.1:{port}"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=os.environ | {"PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 30
        text = ""
        while time.monotonic() < deadline:
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            except httpx.HTTPError:
                text = ""
            if len(values(text, "DCGM_FI_DEV_GPU_TEMP")) == 2 and values(text, "laggard_agent_push_failures_total", node="sim-1") not in ([], [0]):
                break
            time.sleep(0.2)
        assert len(values(text, "DCGM_FI_DEV_GPU_TEMP", Hostname="sim-1", cluster="lab")) == 2
        hot = values(text, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", gpu="1")[0]
        assert int(hot) & 0x40  # the injected HW thermal slowdown
        assert values(text, "laggard_agent_push_failures_total", node="sim-1")[0] > 0
        assert httpx.get(f"http://127.0.0.1:{port}/other", timeout=5).status_code == 404
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert "Traceback" not in out, out[-3000:]


def test_attribution_failures_are_counted_by_reason(tmp_path):
    """laggard_agent_attribution_errors_total{reason}: every counter of the agent's attribution
    (docs/attribution.md, "Failures are counted"), zeros included, served on /metrics; no family
    while attribution is off."""
    from agent.metrics import start_metrics
    from agent.sim.proctree import slurm_path, v2, write_process
    from agent.workload import open_attribution

    proc = tmp_path / "proc"
    (write_process(proc, 500, cgroup=v2(slurm_path(4242, 0)), comm="python") / "environ").unlink()  # environ unreadable
    attribution = open_attribution(proc_root=str(proc), node="n1", kubernetes="off")
    attribution.attributor.attribute([[500], [777]])  # 777: no such process in the tree
    metrics, server = start_metrics("127.0.0.1:0", None, node="n1", cluster="prod", driver=None, attribution=attribution)
    try:
        text = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=5).text
    finally:
        server.close()
    name = "laggard_agent_attribution_errors_total"
    assert f"# TYPE {name} counter" in text
    assert values(text, name, cluster="prod", node="n1", reason="proc_unreadable") == [1]
    assert values(text, name, reason="environ_unreadable") == [1]
    reasons = {dict(labels)["reason"] for n, labels in samples(text) if n == name}
    assert reasons == set(attribution.counters()) >= {"nvml_not_supported", "nvml_no_permission", "nvml_failed", "attribution_failed"}
    assert values(text, name, reason="nvml_failed") == [0]
    assert name not in NodeMetrics(None, node="n1", cluster="prod").exposition()
