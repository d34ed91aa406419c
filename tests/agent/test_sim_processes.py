"""Processes on simulated GPUs (issue #15 item 5): the simulated libnvidia-ml lists each SimGpu's
processes through the real pynvml (v3 and v2), a simulated node keeps a /proc tree of them, and
the real attribution names the job on each GPU, Slurm from environ and Kubernetes from a pod list
served over real HTTP; `laggard-agent --simulate` attributes its one simulated job."""

from __future__ import annotations

import os
import time

import pynvml
import pytest

from agent.cli import SIM_JOB, parse_config, simulated_sources
from agent.runner import collect
from agent.sim.fleet import SimFleet
from agent.sim.libnvml import SimNvmlLib
from agent.sim.proctree import SimProcess, slurm_path, v2
from agent.workload import IDLE, NvmlProcesses
from tests.agent.pod_server import PodServer, pod

UID = "6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b"
CID = "c" * 64
GIB = 1 << 30


@pytest.fixture
def nvml(install, h100_node):
    install(SimNvmlLib(h100_node))
    h100_node.advance(0.0)
    pynvml.nvmlInit()
    yield h100_node
    pynvml.nvmlShutdown()


def _handle(i: int):
    return pynvml.nvmlDeviceGetHandleByIndex(i)


def test_process_lists_through_pynvml_v3_and_v2(nvml):
    started = nvml.run_slurm_job(77, "train", gpus=[0, 1])
    nvml.gpu(2).processes = [SimProcess(900, v2(slurm_path(78, 0)), used_bytes=3 * GIB),
                             SimProcess(901, v2(slurm_path(78, 0)), used_bytes=GIB)]
    for call in (pynvml.nvmlDeviceGetComputeRunningProcesses_v3, pynvml.nvmlDeviceGetComputeRunningProcesses_v2):
        zero, one, two, three = (call(_handle(i)) for i in range(4))
        assert [p.pid for p in zero] == [started[0].pid] and [p.pid for p in one] == [started[1].pid]
        # Unset memory: the GPU's used memory (one process holds all of it).
        assert zero[0].usedGpuMemory == nvml.gpu(0).state.mem_used_bytes > 0
        assert [(p.pid, p.usedGpuMemory) for p in two] == [(900, 3 * GIB), (901, GIB)]
        assert three == []
    assert pynvml.nvmlDeviceGetGraphicsRunningProcesses_v3(_handle(0)) == []
    assert pynvml.nvmlDeviceGetMPSComputeRunningProcesses_v2(_handle(0)) == []
    # The agent's reader, merged over the three lists.
    assert [p.pid for p in NvmlProcesses().read(_handle(0))] == [started[0].pid]
    nvml.stop_processes([0])
    assert pynvml.nvmlDeviceGetComputeRunningProcesses_v3(_handle(0)) == []


def test_an_older_driver_answers_v2_only(install, h100_node):
    lib = install(SimNvmlLib(h100_node, omit=[n for n in SimNvmlLib().functions if n.endswith("RunningProcesses_v3")]))
    assert not any(n.endswith("_v3") and "Processes" in n for n in lib.functions)
    h100_node.advance(0.0)
    pynvml.nvmlInit()
    try:
        (proc,) = h100_node.run_slurm_job(5, gpus=[3])
        reader = NvmlProcesses()
        assert [p.pid for p in reader.read(_handle(3))] == [proc.pid]
        assert reader.read(_handle(0)) == [] and sum(reader.errors.values()) == 0
    finally:
        pynvml.nvmlShutdown()


def test_a_simulated_node_attributes_its_jobs(monkeypatch):
    api = PodServer([pod("llama-70b-workers-0-0", UID, namespace="ml", containers={"trainer": CID},
                         labels={"jobset.sigs.k8s.io/jobset-name": "llama-70b"})], token=None)
    fleet = SimFleet()
    with api:
        try:
            node = fleet.add_node("gpu-1", gpus=8, attribution=True, pods_url=api.pods_url())
            slurm = node.sim.run_slurm_job(4242, "llm-b", gpus=[0, 1, 2, 3], user="alice", first_task=8)
            k8s = node.sim.run_pod(UID, CID, gpus=[4, 5])
            root = node.proc.root
            ws = [g.workload for g in collect(1_000.0, node, node.read_nics).gpus]
            # The pod list comes in the background: the pod's name follows in a later sample.
            deadline = time.monotonic() + 10
            while ws[4].pod is None and time.monotonic() < deadline:
                node.attribution.attributor.pods.wait_idle()
                ws = [g.workload for g in collect(1_001.0, node, node.read_nics).gpus]
            for i, w in enumerate(ws[:4]):
                assert (w.kind, w.slurm_job_id, w.job, w.user, w.slurm_step, w.pid) == ("slurm", "4242", "llm-b", "alice", "0", slurm[i].pid)
            for i, w in zip((4, 5), ws[4:6]):
                assert (w.kind, w.job, w.namespace, w.pod, w.container, w.pid) == ("k8s", "llama-70b", "ml", "llama-70b-workers-0-0",
                                                                                   "trainer", k8s[i - 4].pid)
            assert ws[6:] == [IDLE, IDLE]
            assert sorted(int(p) for p in os.listdir(root)) == sorted(p.pid for p in slurm + k8s)
            assert (root / str(slurm[0].pid) / "environ").read_bytes().count(b"SLURM_PROCID=8\0") == 1

            # The job ends: its GPUs go idle and its processes leave the simulated /proc.
            node.sim.stop_processes([0, 1, 2, 3])
            ws = [g.workload for g in collect(1_002.0, node, node.read_nics).gpus]
            assert ws[:4] == [IDLE] * 4 and ws[4].kind == "k8s"
            assert sorted(int(p) for p in os.listdir(root)) == sorted(p.pid for p in k8s)
            counters = node.attribution.counters()
            assert counters.pop("k8s_pod_unknown") >= 2 and sum(counters.values()) == 0  # unknown: before the first list came
        finally:
            fleet.close()
    assert not root.exists()


def test_simulated_agent_attributes_its_job():
    assert parse_config(["--simulate", "H100:2"], {}).attribution == "auto"
    sources = simulated_sources("h100", 2, [], node="sim-1")
    try:
        assert sources.attribution is sources.gpus.attribution is not None
        ws = [g.workload for g in collect(1_000.0, sources.gpus, sources.read_nics).gpus]
        assert [(w.kind, w.slurm_job_id, w.job) for w in ws] == [("slurm", SIM_JOB[0], SIM_JOB[1])] * 2
    finally:
        sources.close()
    sources = simulated_sources("h100", 2, [], node="sim-1", attribution="off")
    try:
        assert sources.attribution is None
        assert [g.workload for g in collect(1_000.0, sources.gpus, sources.read_nics).gpus] == [None, None]
    finally:
        sources.close()
