"""The per-GPU workload record (no imports: agent/sample.py can hold it once it goes on the wire)."""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("k8s", "slurm", "process")


@dataclass(frozen=True, slots=True)
class Workload:
    """What one GPU is used by. kind None: idle (no process on the GPU)."""

    kind: str | None = None  # "k8s" | "slurm" | "process" | None
    job: str | None = None  # k8s: the pod's job (kubernetes.job_of); Slurm: the job name
    namespace: str | None = None
    pod: str | None = None
    pod_uid: str | None = None
    container: str | None = None  # container name in the pod
    container_id: str | None = None  # from the cgroup path (any kind)
    slurm_job_id: str | None = None
    slurm_step: str | None = None
    user: str | None = None  # Slurm job user
    process: str | None = None  # comm of the dominant process
    pid: int | None = None  # the dominant process (host PID namespace)
    processes: int = 0  # processes on this GPU
    workloads: int = 0  # distinct workloads on this GPU (> 1: shared)


IDLE = Workload()
