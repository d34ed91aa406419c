"""Attribution wired into the agent (issue #15): NvmlGpuSource sets each GpuSample's workload
from one attribution read per cycle, over the simulated GPUs, the real pynvml and a fixture /proc
tree; the batch carries it and the collector's decoder accepts it; the flags."""

from __future__ import annotations

import json

from agent.cli import parse_config
from agent.runner import collect
from agent.sample import GPU_METRIC_FIELDS, build_batch, json_default, sample_from_dict, sample_to_dict
from agent.sim.fleet import SimFleet
from agent.sim.install import install_simulated_nvml, uninstall_simulated_nvml
from agent.sim.proctree import k8s_path, slurm_path, v2, write_process
from agent.workload import open_attribution
from agent.workload.record import IDLE, Workload
from tests.agent.proc_lib import ProcLib

CID = "0123456789abcdef" * 4
UID = "6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b"
SLURM_ENV = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "llm-b", "SLURM_JOB_USER": "alice"}


class _WithProcesses:
    """The simulated GPUs' library, plus the running-process entry points of a ProcLib."""

    def __init__(self, sim, procs: ProcLib) -> None:
        self._sim, self._procs = sim, procs

    def __getattr__(self, name: str):
        if "RunningProcesses" in name:
            return getattr(self._procs, name)
        return getattr(self._sim, name)


def _handle(source, index: int) -> int:
    import ctypes

    handle = source._handles[index]
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


def test_each_gpu_sample_carries_its_workload(tmp_path):
    proc = tmp_path / "proc"
    write_process(proc, 100, cgroup=v2(k8s_path(UID, CID)), comm="torchrun")
    write_process(proc, 500, cgroup=v2(slurm_path(4242, 0)), comm="python", environ=SLURM_ENV)
    fleet = SimFleet()
    procs = ProcLib()
    install_simulated_nvml(_WithProcesses(fleet.lib, procs))
    try:
        node = fleet.add_node("gpu-1", model="h100", gpus=4)
        source = node.source
        source.attribution = open_attribution(proc_root=str(proc), node="gpu-1", kubernetes="off")
        procs.procs[(_handle(source, 0), "compute")] = [(100, 60 << 30)]
        procs.procs[(_handle(source, 1), "compute")] = [(500, 10 << 30)]
        procs.errors[(_handle(source, 3), "compute")] = procs.errors[(_handle(source, 3), "graphics")] = \
            procs.errors[(_handle(source, 3), "mps")] = 4  # NVML_ERROR_NO_PERMISSION: unknown
        sample = collect(1_000.0, node, node.read_nics)
        k8s, slurm, idle, unknown = (g.workload for g in sample.gpus)
        assert (k8s.kind, k8s.pod_uid, k8s.container_id, k8s.process) == ("k8s", UID, CID, "torchrun")
        assert (slurm.kind, slurm.slurm_job_id, slurm.job, slurm.user) == ("slurm", "4242", "llm-b", "alice")
        assert idle == IDLE and unknown is None
        assert source.attribution.counters()["nvml_no_permission"] == 1

        # On the wire, through both encoders the agent has, and accepted by the collector.
        body = build_batch([sample], node="gpu-1", cluster="c", labels={}, agent_info={})
        raw = json.dumps(body, default=json_default).encode()
        assert json.loads(raw) == json.loads(json.dumps(body))
        wire = json.loads(raw)["samples"][0]["gpus"]
        assert wire[0]["workload"]["pod_uid"] == UID and wire[2]["workload"]["kind"] is None and wire[3]["workload"] is None
        from server.ingest.protocol_decoder import BATCH_STRUCT_DECODER

        decoded = BATCH_STRUCT_DECODER.decode(raw)
        assert decoded.samples[0].gpus[1].workload["slurm_job_id"] == "4242"
        # And back from the spool.
        again = sample_from_dict(json.loads(json.dumps(sample_to_dict(sample))))
        assert [g.workload for g in again.gpus] == [k8s, slurm, idle, None]
    finally:
        fleet.close()
        uninstall_simulated_nvml()


def test_an_attribution_failure_leaves_workloads_unknown_and_sampling_on():
    class Broken:
        def read(self, handles):
            raise RuntimeError("a bug")

        def close(self):
            pass

    fleet = SimFleet()
    try:
        node = fleet.add_node("gpu-1", gpus=2)
        node.source.attribution = Broken()
        sample = collect(1_000.0, node, node.read_nics)
        assert [g.workload for g in sample.gpus] == [None, None]
        assert all(g.temp_c is not None for g in sample.gpus)
    finally:
        fleet.close()


def test_without_attribution_the_workload_is_unknown_and_not_a_metric():
    fleet = SimFleet()
    try:
        node = fleet.add_node("gpu-1", gpus=1)
        assert node.source.attribution is None
        assert collect(1_000.0, node, node.read_nics).gpus[0].workload is None
    finally:
        fleet.close()
    assert "workload" not in GPU_METRIC_FIELDS


def test_spool_written_by_an_older_agent_reads_back_as_unknown():
    assert sample_from_dict({"ts": 1.0, "gpus": [{"index": 0, "uuid": "GPU-1"}]}).gpus[0].workload is None
    newer = sample_from_dict({"ts": 1.0, "gpus": [{"index": 0, "uuid": "GPU-1", "workload": {"kind": "process", "pid": 3, "cgroup": "/x"}}]})
    assert newer.gpus[0].workload == Workload(kind="process", pid=3)


def test_flags():
    cfg = parse_config([], {})
    assert (cfg.proc_root, cfg.attribution, cfg.pods_url, cfg.scontrol) == ("/proc", "auto", None, None)
    cfg = parse_config(["--proc-root", "/host/proc", "--attribution", "off", "--pods-url", "http://x/pods", "--scontrol", "/usr/bin/scontrol"], {})
    assert (cfg.proc_root, cfg.attribution, cfg.pods_url, cfg.scontrol) == ("/host/proc", "off", "http://x/pods", "/usr/bin/scontrol")
    env = {"LAGGARD_PROC_ROOT": "/hp", "LAGGARD_ATTRIBUTION": "OFF", "LAGGARD_PODS_URL": "http://y", "LAGGARD_SCONTROL": "/s"}
    cfg = parse_config([], env)
    assert (cfg.proc_root, cfg.attribution, cfg.pods_url, cfg.scontrol) == ("/hp", "off", "http://y", "/s")
    assert parse_config(["--simulate", "H100:2"], {}).attribution == "auto"  # simulated processes (test_sim_processes.py)


def test_a_bad_attribution_setting_is_a_usage_error(capsys):
    import pytest

    with pytest.raises(SystemExit) as exc:
        parse_config([], {"LAGGARD_ATTRIBUTION": "sometimes"})
    assert exc.value.code == 2
    assert "--attribution 'sometimes'" in capsys.readouterr().err
