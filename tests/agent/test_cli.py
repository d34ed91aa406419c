from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from agent.cli import main, parse_config, parse_simulate
from agent.runner import Runner
from agent.sample import GpuSample

REPO = Path(__file__).resolve().parents[2]


# --- flags and environment ------------------------------------------------------------


def test_defaults_without_env():
    cfg = parse_config([], env={})
    assert cfg.collector == "http://127.0.0.1:8080"
    assert cfg.interval == 5.0
    assert cfg.node == socket.gethostname()
    assert cfg.cluster is None  # the cluster the token is bound to, asked of the collector
    assert cfg.auth_retry == 60.0
    assert cfg.labels == {}
    assert cfg.sysfs_root == "/sys"
    assert cfg.token is None and not cfg.once and cfg.simulate is None


def test_env_fallbacks():
    env = {
        "LAGGARD_COLLECTOR_URL": "https://collector:9000",
        "LAGGARD_INTERVAL": "1",
        "NODE_NAME": "gpu-node-7",
        "LAGGARD_CLUSTER": "train-a",
        "LAGGARD_LABELS": "rack=r12, zone=z1",
        "LAGGARD_SYSFS_ROOT": "/host/sys",
        "LAGGARD_TOKEN": "t0k",
        "LAGGARD_BATCH": "6",
        "LAGGARD_AUTH_RETRY": "300",
    }
    cfg = parse_config([], env=env)
    assert cfg.collector == "https://collector:9000"
    assert cfg.interval == 1.0
    assert cfg.node == "gpu-node-7"
    assert cfg.cluster == "train-a"
    assert cfg.labels == {"rack": "r12", "zone": "z1"}
    assert cfg.sysfs_root == "/host/sys"
    assert cfg.token == "t0k"
    assert cfg.batch == 6
    assert cfg.auth_retry == 300.0


@pytest.mark.parametrize(("url", "allowed"), [
    ("http://127.0.0.1:8080", True), ("http://localhost:8080", True), ("http://[::1]:8080", True), ("http://127.3.2.1", True),
    ("https://collector:8080", True), ("http://collector:8080", False), ("http://10.0.0.5:8080", False),
])
def test_plain_http_only_to_this_host_unless_allowed(url, allowed, capsys):
    if allowed:
        assert parse_config(["--collector", url], env={}).collector == url
    else:
        with pytest.raises(SystemExit) as exit_:
            parse_config(["--collector", url], env={})
        assert exit_.value.code == 2 and "--allow-insecure-http" in capsys.readouterr().err
        assert parse_config(["--collector", url, "--allow-insecure-http"], env={}).collector == url
        assert parse_config(["--collector", url], env={"LAGGARD_ALLOW_INSECURE_HTTP": "1"}).collector == url


def test_token_from_a_file_and_a_ca_bundle_that_must_exist(tmp_path, capsys):
    token_file = tmp_path / "token"
    token_file.write_text("lgd_0123456789ab_secret\n")
    cfg = parse_config(["--token-file", str(token_file)], env={"LAGGARD_CA_BUNDLE": str(token_file)})
    assert cfg.token == "lgd_0123456789ab_secret" and cfg.ca_bundle == str(token_file)
    with pytest.raises(SystemExit):
        parse_config(["--ca-bundle", str(tmp_path / "missing.pem")], env={})
    assert "no such file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_config(["--token-file", str(tmp_path / "missing")], env={})


def test_flags_win_over_env():
    env = {"LAGGARD_INTERVAL": "10", "NODE_NAME": "from-env", "LAGGARD_LABELS": "rack=r1,zone=z1"}
    cfg = parse_config(["--interval", "2", "--node", "from-flag", "--label", "rack=r9", "--label", "pool=a=b"],
                       env=env)
    assert cfg.interval == 2.0 and cfg.node == "from-flag"
    assert cfg.labels == {"rack": "r9", "zone": "z1", "pool": "a=b"}


def test_default_batch_covers_about_ten_seconds():
    assert parse_config([], env={}).batch == 2
    assert parse_config(["--interval", "1"], env={}).batch == 10
    assert parse_config(["--interval", "30"], env={}).batch == 1
    assert parse_config(["--interval", "1", "--batch", "3"], env={}).batch == 3


def test_output_implies_once():
    cfg = parse_config(["--output", "/tmp/x.json"], env={})
    assert cfg.once and cfg.output == "/tmp/x.json"
    assert parse_config(["--once"], env={}).output == "-"


@pytest.mark.parametrize(
    "argv,env,message",
    [
        (["--label", "foo"], {}, "--label 'foo': expected KEY=VALUE"),
        (["--label", "=v"], {}, "expected KEY=VALUE"),
        ([], {"LAGGARD_LABELS": "rack"}, "LAGGARD_LABELS item 'rack'"),
        (["--interval", "0"], {}, "--interval 0: must be a positive"),
        (["--interval", "abc"], {}, "invalid float value"),
        ([], {"LAGGARD_INTERVAL": "soon"}, "LAGGARD_INTERVAL='soon' is not a number"),
        (["--batch", "0"], {}, "--batch 0"),
        (["--auth-retry", "0"], {}, "--auth-retry 0: must be a positive"),
        ([], {"LAGGARD_AUTH_RETRY": "later"}, "LAGGARD_AUTH_RETRY='later' is not a number"),
        (["--collector", "collector:8080"], {}, "expected an http:// or https:// URL"),
        (["--simulate", "H100:zero"], {}, "N must be a positive number"),
        (["--fault", "gpu1:thermal"], {}, "--fault needs --simulate"),
    ],
)
def test_bad_input_exits_2_with_message(argv, env, message, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_config(argv, env=env)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_parse_simulate():
    assert parse_simulate("H100:2") == ("H100", 2)
    assert parse_simulate("H200") == ("H200", 8)


def test_missing_nvml_says_to_simulate(monkeypatch, capsys):
    import pynvml

    def no_library():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    assert main(["--once"]) == 1
    err = capsys.readouterr().err
    assert "NVML" in err and "--simulate" in err


# --- one simulated sample ---------------------------------------------------------------


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run([sys.executable, "-m", "agent.cli", *args], cwd=REPO, env=full_env,
                          capture_output=True, text=True, timeout=60)


def test_once_simulated_prints_valid_batch():
    proc = run_cli("--simulate", "H100:2", "--once", "--output", "-", "--node", "sim-1", "--label", "rack=r1")
    assert proc.returncode == 0, proc.stderr
    body = json.loads(proc.stdout)
    assert body["version"] == 1
    assert body["node"] == "sim-1" and body["cluster"] == "default" and body["labels"] == {"rack": "r1"}
    assert set(body["agent"]) == {"version", "driver", "cuda", "boot_time"}
    # The node's boot time (remedy evidence for hardware faults, server/hints/remedy.py).
    btime = next(float(line.split()[1]) for line in open("/proc/stat") if line.startswith("btime "))
    assert body["agent"]["boot_time"] == btime
    [sample] = body["samples"]
    assert len(sample["gpus"]) == 2
    assert all("H100" in (g["model"] or "") for g in sample["gpus"])
    assert len(sample["nics"]) == 8
    nic = sample["nics"][0]
    assert nic["device"] == "mlx5_0" and nic["state"] == "ACTIVE" and nic["rate_gbps"] == 400.0
    assert nic["tx_bytes_total"] % 4 == 0


def test_once_simulated_with_faults_to_file(tmp_path):
    out = tmp_path / "batch.json"
    proc = run_cli("--simulate", "H100:2", "--fault", "ib1:down", "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    nics = json.loads(out.read_text())["samples"][0]["nics"]
    assert nics[1]["state"] == "DOWN" and nics[1]["link_downed_total"] == 1


@pytest.mark.parametrize("spec,message", [("ib1:melted", "ib1:melted"), ("gpu5:thermal", "no GPU 5"),
                                          ("gpu0:melted", "unknown fault"), ("ib9:down", "ib9")])
def test_bad_fault_spec_is_a_clear_error(spec, message):
    proc = run_cli("--simulate", "H100:2", "--fault", spec, "--once")
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_agent_pushes_until_sigterm_then_exits_cleanly():
    from tests.agent.test_push import Collector

    collector = Collector()
    try:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        proc = subprocess.Popen(
            [sys.executable, "-m", "agent.cli", "--simulate", "H100:2", "--interval", "0.2", "--batch", "2",
             "--collector", collector.url, "--node", "sig-node", "--fault", "gpu1:thermal"],
            cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 20
        while len(collector.requests) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20)
    finally:
        collector.close()
    assert proc.returncode == 0, stderr
    assert "stopped:" in stderr
    bodies = [r["json"] for r in collector.requests]
    assert len(bodies) >= 2 and all(b["node"] == "sig-node" for b in bodies)
    samples = [s for b in bodies for s in b["samples"]]
    assert all(len(s["gpus"]) == 2 and len(s["nics"]) == 8 for s in samples)
    ts = [s["ts"] for s in samples]
    assert ts == sorted(ts) and len(set(ts)) == len(ts)


# --- the sampling loop ----------------------------------------------------------------


class FakeGpus:
    def __init__(self) -> None:
        self.calls: list[float] = []

    def read(self, ts: float) -> list[GpuSample]:
        self.calls.append(ts)
        time.sleep(0.01)  # work must not push the schedule back
        return [GpuSample(index=0, uuid="GPU-0")]


class ListSink:
    def __init__(self) -> None:
        self.samples = []

    def submit(self, sample) -> None:
        self.samples.append(sample)


def test_runner_fixed_cadence_without_drift():
    gpus, sink = FakeGpus(), ListSink()
    runner = Runner(gpus, sink, interval=0.05, read_nics=lambda ts: [])
    runner.run(max_ticks=10)
    ts = [s.ts for s in sink.samples]
    assert len(ts) == 10
    steps = [b - a for a, b in zip(ts, ts[1:])]
    assert all(abs(step - 0.05) < 1e-6 for step in steps)  # on the grid despite 10 ms reads
    assert all(abs(t / 0.05 - round(t / 0.05)) < 1e-3 for t in ts)  # aligned to the interval


def test_runner_skips_missed_ticks_instead_of_bursting():
    sink = ListSink()

    class Slow(FakeGpus):
        def read(self, ts):
            if not self.calls:
                time.sleep(0.23)  # one read stalls for several intervals
            self.calls.append(ts)
            return []

    runner = Runner(Slow(), sink, interval=0.05, read_nics=lambda ts: [])
    runner.run(max_ticks=4)
    ts = [s.ts for s in sink.samples]
    assert ts[1] - ts[0] >= 0.2 and runner.skipped >= 3
    assert all(abs(b - a - 0.05) < 1e-6 for a, b in zip(ts[1:], ts[2:]))


def test_runner_stops_promptly_and_survives_reader_errors(caplog):
    class Broken:
        def read(self, ts):
            raise RuntimeError("boom")

    sink, stop = ListSink(), threading.Event()
    runner = Runner(Broken(), sink, interval=0.02, read_nics=lambda ts: 1 / 0, stop=stop)
    with caplog.at_level(logging.INFO, logger="agent.runner"):
        thread = runner.start()
        time.sleep(0.15)
        stop.set()
        thread.join(timeout=1)
    assert not thread.is_alive()
    assert len(sink.samples) >= 3 and all(s.gpus == [] and s.nics == [] for s in sink.samples)
    # a reader that keeps failing is logged once, not every tick
    assert caplog.text.count("GPU read failed") == 1 and caplog.text.count("NIC read failed") == 1

