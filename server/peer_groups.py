"""Who is compared with whom: the peer-group keys and what counts as a busy GPU.

The vocabulary the detector (server/detect) judges by and the metrics (server/metrics) show
the comparison by, so that a dashboard's peer median is the detector's. Neither imports the
other; both import this."""

from __future__ import annotations

from collections.abc import Mapping

IDLE_REASON = 0x1  # nvmlClocksEventReasonGpuIdle
BUSY_UTIL_PCT = 10.0


def is_busy(util_gpu_pct: float | None, reasons: int | None) -> bool:
    """Doing work: not idle-flagged and utilised. Idle GPUs are never judged as slow."""
    if reasons is not None and reasons & IDLE_REASON:
        return False
    return util_gpu_pct is not None and util_gpu_pct >= BUSY_UTIL_PCT


def peer_group(*, cluster: str, model: str | None, labels: Mapping[str, str], workload: str | None = None) -> str:
    """Peers: same cluster, same GPU model, same job: the workload running on the GPU (its
    workload_key) where the agent attributed one, else the node's job label, else its partition,
    else the whole cluster."""
    return f"{cluster}|{model or '?'}|{workload or _scope(labels)}"


def workload_key(kind: str | None, *, namespace: str | None, job: str | None, pod: str | None, slurm_job_id: str | None) -> str | None:
    """The job a GPU's workload belongs to, as a peer-group scope (issue #15): a Kubernetes job
    (else its pod) in its namespace, or a Slurm job id; None for an idle GPU, a bare process or
    an unknown workload (the labels decide then)."""
    if kind == "k8s" and (job or pod):
        return f"k8s:{namespace or ''}/{job or pod}"
    if kind == "slurm" and slurm_job_id:
        return f"slurm:{slurm_job_id}"
    return None


def nic_group(*, cluster: str, labels: Mapping[str, str]) -> str:
    return f"{cluster}|nic|{_scope(labels)}"


def _scope(labels: Mapping[str, str]) -> str:
    return labels.get("job") or labels.get("partition") or "*"


def workload_job(kind: str | None, *, job: str | None, pod: str | None, slurm_job_id: str | None) -> str | None:
    """The job's name as its users know it, for filtering (`?job=`): a Kubernetes job (else the
    pod), a Slurm job's name (else its id); None where workload_key is None."""
    if kind == "k8s":
        return job or pod
    if kind == "slurm" and slurm_job_id:
        return job or slurm_job_id
    return None


def workload_label(kind: str | None, *, namespace: str | None, job: str | None, pod: str | None, slurm_job_id: str | None) -> str | None:
    """The workload as a person names it in an episode's summary: "job llm-a, pod llm-a-3",
    "pod notebook-7", "Slurm job 4242 (llm-b)"; None where workload_key is None."""
    if kind == "k8s" and (job or pod):
        return f"job {job}, pod {pod}" if job and pod else f"job {job}" if job else f"pod {pod}"
    if kind == "slurm" and slurm_job_id:
        return f"Slurm job {slurm_job_id} ({job})" if job else f"Slurm job {slurm_job_id}"
    return None
