"""`laggard demo`, as a user runs it: a subprocess, real HTTP, the simulated fleet reporting."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time

import httpx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_demo_fleet_reports_through_the_collector(tmp_path):
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "server.cli", "demo", "--nodes", "4", "--gpus", "8", "--interval", "1", "--duration", "60", "--port", str(port)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=os.environ | {"PYTHONUNBUFFERED": "1"},
    )
    lines: list[str] = []  # the output, as it comes

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 25
        nodes = []
        while time.monotonic() < deadline:
            try:
                nodes = httpx.get(f"{url}/api/v1/nodes", timeout=5).json()["nodes"]
            except httpx.HTTPError:
                nodes = []
            if len(nodes) == 4 and all(n["gpu_count"] == 8 for n in nodes):
                break
            time.sleep(0.5)
        assert sorted(n["node"] for n in nodes) == [f"gpu-node-{i:03d}" for i in range(4)]
        assert {n["cluster"] for n in nodes} == {"demo"}
        detail = httpx.get(f"{url}/api/v1/nodes/gpu-node-002").json()
        # Node 2 runs hot on GPU 5 (an injected thermal fault): its reason bits say so.
        gpu5 = detail["gpus"][5]["latest"]
        assert gpu5["clocks_event_reasons"] & (0x20 | 0x40)
        assert detail["gpus"][0]["latest"]["clocks_event_reasons"] & (0x20 | 0x40) == 0
        assert len(detail["nics"]) == 8 and detail["nics"][0]["latest"]["state"] == "ACTIVE"
        assert (tmp_path / "laggard-demo.db").exists()
        # Two Slurm jobs and an idle node, attributed by each agent from its simulated /proc
        # (no `job` label): nodes 0-1 run one job, node 2 the other, node 3 nothing.
        jobs = {}
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            jobs = {n: [g["workload"] for g in httpx.get(f"{url}/api/v1/nodes/gpu-node-{n:03d}", timeout=5).json()["gpus"]]
                    for n in range(4)}
            if all(w is not None for ws in jobs.values() for w in ws):
                break
            time.sleep(0.5)
        for n, (job_id, name) in {0: ("4101", "llm-pretrain"), 1: ("4101", "llm-pretrain"), 2: ("4102", "llm-finetune")}.items():
            assert {(w["kind"], w["slurm_job_id"], w["job"], w["user"]) for w in jobs[n]} == {("slurm", job_id, name, "demo")}, jobs[n]
        assert [w["kind"] for w in jobs[3]] == [None] * 8
        assert all(n["labels"].get("job") is None for n in httpx.get(f"{url}/api/v1/nodes", timeout=5).json()["nodes"])
        # The detector finds the injected fault, and nothing else.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            found = httpx.get(f"{url}/api/v1/stragglers", timeout=5).json()["stragglers"]
            if found:
                break
            time.sleep(0.5)
        assert [(s["node"], s["gpu"], s["cause"]) for s in found] == [("gpu-node-002", 5, "thermal")]
        # Judged among its job's GPUs, and named by it.
        assert found[0]["summary"].startswith("Slurm job 4102 (llm-finetune): "), found[0]["summary"]
        # At least one progress line (every 2 s) since: it shows the straggler and every node reporting.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not ("straggler #1 gpu-node-002 GPU 5: thermal" in "".join(lines)
                                                    and re.search(r"nodes reporting 4/4", "".join(lines))):
            time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        reader.join(60)
    out = "".join(lines)
    assert "laggard demo" in out.lower() or "Laggard demo" in out
    assert re.search(r"nodes reporting 4/4", out), out[-2000:]
    assert "straggler #1 gpu-node-002 GPU 5: thermal" in out
    assert ("jobs: llm-pretrain (Slurm job 4101) on gpu-node-000 .. gpu-node-001; "
            "llm-finetune (Slurm job 4102) on gpu-node-002; idle: gpu-node-003") in out
    assert "Traceback" not in out, out[-3000:]
    assert proc.returncode == 0 and "stopped." in out
    # The database stays for a look afterwards; the locks' side files go with the collector (issue #16).
    assert sorted(p.name for p in tmp_path.iterdir() if "lock" in p.name) == []
    assert (tmp_path / "laggard-demo.db").exists()
