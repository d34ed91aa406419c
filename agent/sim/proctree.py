"""A fixture /proc tree for attribution (agent.workload): <root>/<pid>/{cgroup,comm,environ}
laid out as the kernel shows them, for tests and bench/attribution.py.

The cgroup helpers write what a node really shows for each case: Kubernetes with the systemd
or cgroupfs driver (cgroup v2 one line, v1 one line per controller), Slurm's cgroup plugin
(v2 under slurmstepd.scope, v1 under slurm/uid_<uid>), a plain Docker container.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
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
