"""A fixture /proc tree for attribution (agent.workload): <root>/<pid>/{cgroup,comm,environ}
laid out as the kernel shows them, for tests and bench/attribution.py.

The cgroup helpers write what a node really shows for each case: Kubernetes with the systemd
or cgroupfs driver (cgroup v2 one line, v1 one line per controller), Slurm's cgroup plugin
(v2 under slurmstepd.scope, v1 under slurm/uid_<uid>), a plain Docker container.

The simulator runs `SimProcess`es on its GPUs (SimGpu.processes, listed by the simulated NVML)
and a simulated node keeps a `ProcTree` of them, so attribution runs on simulated nodes too.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

_V1_CONTROLLERS = ("cpuset", "cpu,cpuacct", "memory", "devices", "freezer", "pids")


def write_process(root: str | os.PathLike[str], pid: int, *, cgroup: str, comm: str = "python3",
                  environ: Mapping[str, str] | None = None) -> Path:
    d = Path(root) / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "cgroup").write_text(cgroup if cgroup.endswith("\n") else cgroup + "\n")
    (d / "comm").write_text(comm[:15] + "\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": "/root", **(environ or {})}
    (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))
    return d


def v2(path: str) -> str:
    return f"0::{path}\n"


def v1(path: str, *, systemd: str = "/system.slice/containerd.service") -> str:
    lines = [f"{i}:{c}:{path}" for i, c in enumerate(_V1_CONTROLLERS, start=2)]
    return "\n".join(["1:name=systemd:" + systemd, *lines, "0::/"]) + "\n"


def k8s_path(pod_uid: str, container_id: str, *, qos: str = "burstable", driver: str = "systemd", runtime: str = "containerd") -> str:
    prefix = {"containerd": "cri-containerd", "cri-o": "crio", "docker": "docker"}[runtime]
    if driver == "systemd":
        uid = pod_uid.replace("-", "_")
        if qos == "guaranteed":
            return f"/kubepods.slice/kubepods-pod{uid}.slice/{prefix}-{container_id}.scope"
        return f"/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{uid}.slice/{prefix}-{container_id}.scope"
    leaf = container_id if runtime == "containerd" else f"{prefix}-{container_id}"
    qos_dir = "" if qos == "guaranteed" else f"/{qos}"
    return f"/kubepods{qos_dir}/pod{pod_uid}/{leaf}"


def slurm_path(job: int | str, step: int | str, *, version: int = 2, uid: int = 1000, task: int = 0) -> str:
    if version == 2:
        return f"/system.slice/slurmstepd.scope/job_{job}/step_{step}/user/task_{task}"
    return f"/slurm/uid_{uid}/job_{job}/step_{step}/task_{task}"


# -- the processes a simulated node runs on its GPUs --------------------------------------------

@dataclass(frozen=True, slots=True)
class SimProcess:
    """One process on a simulated GPU: what NVML lists (pid, GPU memory; None: the GPU's used
    memory shared among its processes) and what /proc shows of it."""

    pid: int
    cgroup: str
    comm: str = "python3"
    environ: Mapping[str, str] = field(default_factory=dict)
    used_bytes: int | None = None


def slurm_process(pid: int, job_id: int | str, *, name: str | None = None, user: str = "sim", step: int | str = 0,
                  task: int = 0, comm: str = "python3") -> SimProcess:
    """A rank of a Slurm job step, under slurmstepd's cgroup v2 tree, its SLURM_* variables set
    (so the job is named without scontrol)."""
    env = {"SLURM_JOB_ID": str(job_id), "SLURM_JOB_USER": user, "SLURM_STEP_ID": str(step), "SLURM_PROCID": str(task)}
    if name:
        env["SLURM_JOB_NAME"] = name
    return SimProcess(pid, v2(slurm_path(job_id, step, task=task)), comm, env)


def k8s_process(pid: int, pod_uid: str, container_id: str, *, comm: str = "python3", qos: str = "burstable") -> SimProcess:
    """A process in a pod's container (systemd driver, containerd, cgroup v2)."""
    return SimProcess(pid, v2(k8s_path(pod_uid, container_id, qos=qos)), comm)


class ProcTree:
    """A simulated /proc under `root`: `sync(processes)` writes the new ones and removes those
    gone, so the tree holds exactly the processes the simulated GPUs run."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._written: dict[int, SimProcess] = {}

    def sync(self, processes: Iterable[SimProcess]) -> None:
        wanted = {p.pid: p for p in processes}
        for pid in set(self._written) - set(wanted):
            shutil.rmtree(self.root / str(pid), ignore_errors=True)
            del self._written[pid]
        for pid, proc in wanted.items():
            if self._written.get(pid) != proc:
                write_process(self.root, pid, cgroup=proc.cgroup, comm=proc.comm, environ=proc.environ)
                self._written[pid] = proc

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        self._written.clear()
