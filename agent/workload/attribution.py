"""Per-GPU workload records from per-GPU process lists: the Attributor.

For each PID: its cgroup (→ pod UID / container id / Slurm job and step), its comm, and for a
process not in a pod its Slurm variables; read once and cached per PID (a process keeps its
cgroup; re-read every `revalidate_s` anyway, for a process moved by pam_slurm_adopt or
systemd). A PID is forgotten once no GPU lists it.

Then per GPU, processes are grouped by workload (a pod; a Slurm job; a container; else the
process itself) and the **dominant workload** is the one holding the most GPU memory on that
GPU (NVML's usedGpuMemory, summed over its processes), then the one with the most processes,
then a pod or Slurm job over a bare process, then the lowest PID. The record describes that
workload through its dominant process (most memory, then lowest PID): container, step and
comm are that process's. `processes` and `workloads` say how many there were in all.

Nothing here raises into the caller: what cannot be found stays None and is counted in
`errors` (see `counters()` for all of them, the lookups' included).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from agent.workload.cgroup import NOTHING, CgroupMatch, classify_cgroup_file
from agent.workload.kubernetes import PodInfo
from agent.workload.nvml import GpuProcess
from agent.workload.procfs import ProcFs
from agent.workload.record import IDLE, Workload
from agent.workload.slurm import SlurmJob, job_from_environ

log = logging.getLogger(__name__)


class ProcReader(Protocol):
    def cgroup(self, pid: int) -> str: ...
    def comm(self, pid: int) -> str: ...
    def environ(self, pid: int) -> dict[str, str]: ...


class PodLookup(Protocol):
    def lookup(self, pod_uid: str) -> PodInfo | None: ...


class SlurmLookup(Protocol):
    def lookup(self, job_id: str) -> SlurmJob | None: ...


@dataclass(slots=True)
class _Proc:
    """What is cached per PID."""

    pid: int
    match: CgroupMatch
    comm: str | None
    slurm: SlurmJob | None  # from environ, only when it agrees with the cgroup's job
    slurm_step: str | None
    read_at: float


def _key(proc: _Proc) -> tuple[str, str | int]:
    """The workload a process belongs to, for grouping a GPU's processes."""
    if proc.match.pod_uid:
        return "k8s", proc.match.pod_uid
    if proc.slurm is not None:
        return "slurm", proc.slurm.job_id
    if proc.match.container_id:
        return "container", proc.match.container_id
    return "pid", proc.pid


_KIND_RANK = {"k8s": 1, "slurm": 1, "container": 0, "pid": 0}


class Attributor:
    """attribute(per_gpu processes) → per-GPU Workload (None where the GPU's list is None)."""

    def __init__(self, proc: ProcReader | None = None, *, pods: PodLookup | None = None, slurm: SlurmLookup | None = None,
                 revalidate_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.proc = proc if proc is not None else ProcFs()
        self.pods = pods
        self.slurm = slurm
        self.revalidate_s = revalidate_s
        self._clock = clock
        self._cache: dict[int, _Proc] = {}
        self._listed: dict[int, frozenset[int]] = {}  # GPU index → PIDs it listed last time
        self.errors = {"proc_unreadable": 0, "environ_unreadable": 0, "attribution_failed": 0}
        self._logged: set[str] = set()

    # -- entry points ------------------------------------------------------------------
    def attribute(self, per_gpu: Sequence[Iterable[GpuProcess | int] | None]) -> list[Workload | None]:
        """One record per GPU, in order: IDLE for an empty list, None for a None list (NVML
        could not say) or a GPU whose attribution failed outright (counted)."""
        return [self.attribute_gpu(index, procs) for index, procs in enumerate(per_gpu)]

    def attribute_gpu(self, index: int, processes: Iterable[GpuProcess | int] | None) -> Workload | None:
        """The same for one GPU (what a per-GPU reader calls); PIDs no GPU lists any more are
        forgotten here, so call it for every GPU of a sample, None lists included."""
        try:
            if processes is None:
                self._forget(index, frozenset())
                return None
            procs = [p if isinstance(p, GpuProcess) else GpuProcess(int(p)) for p in processes]
            self._forget(index, frozenset(p.pid for p in procs))
            return self._workload(procs) if procs else IDLE
        except Exception as exc:  # a bug here must not cost the sample
            self.errors["attribution_failed"] += 1
            if type(exc).__name__ not in self._logged:
                self._logged.add(type(exc).__name__)
                log.exception("attribution failed on GPU %d", index)
            return None

    def counters(self) -> dict[str, int]:
        """Every failure counter: this one's and its lookups' (reason → count)."""
        out = dict(self.errors)
        for part in (self.pods, self.slurm):
            out.update(getattr(part, "errors", {}))
        return out

    @property
    def cached_pids(self) -> int:
        return len(self._cache)

    # -- per process -------------------------------------------------------------------
    def _forget(self, index: int, pids: frozenset[int]) -> None:
        before = self._listed.get(index, frozenset())
        self._listed[index] = pids
        gone = before - pids
        if gone:
            for pid in gone:
                if not any(pid in other for other in self._listed.values()):
                    self._cache.pop(pid, None)

    def _proc(self, pid: int) -> _Proc:
        now = self._clock()
        cached = self._cache.get(pid)
        if cached is not None and now - cached.read_at < self.revalidate_s:
            return cached
        try:
            text = self.proc.cgroup(pid)
        except OSError:
            # Gone since NVML listed it, or not in our PID namespace (no hostPID): not cached,
            # tried again next time.
            self.errors["proc_unreadable"] += 1
            return _Proc(pid, NOTHING, None, None, None, now)
        match = classify_cgroup_file(text)
        try:
            comm: str | None = self.proc.comm(pid) or None
        except OSError:
            comm = None
        slurm, step = (None, None) if match.pod_uid else self._slurm_env(pid, match)
        entry = _Proc(pid, match, comm, slurm, match.slurm_step or step, now)
        self._cache[pid] = entry
        return entry

    def _slurm_env(self, pid: int, match: CgroupMatch) -> tuple[SlurmJob | None, str | None]:
        """The Slurm job of a process not in a pod: the cgroup's job id, named from environ when
        environ agrees; environ alone when the cgroup names no job (no cgroup plugin)."""
        try:
            env_job, env_step = job_from_environ(self.proc.environ(pid))
        except OSError:
            self.errors["environ_unreadable"] += 1
            env_job, env_step = None, None
        if match.slurm_job_id is None:
            return env_job, env_step
        if env_job is not None and env_job.job_id == match.slurm_job_id:
            return env_job, env_step
        return SlurmJob(match.slurm_job_id), None

    # -- per GPU -----------------------------------------------------------------------
    def _workload(self, procs: list[GpuProcess]) -> Workload:
        groups: dict[tuple[str, str | int], list[tuple[GpuProcess, _Proc]]] = {}
        for gp in procs:
            proc = self._proc(gp.pid)
            groups.setdefault(_key(proc), []).append((gp, proc))
        key, members = max(groups.items(), key=_dominance)
        _, top = min(members, key=lambda m: (-(m[0].used_bytes or 0), m[0].pid))
        common = {"process": top.comm, "pid": top.pid, "processes": len(procs), "workloads": len(groups),
                  "container_id": top.match.container_id}
        if key[0] == "k8s":
            return self._k8s(top, common)
        if key[0] == "slurm":
            return self._slurm(top, members, common)
        return Workload(kind="process", **common)

    def _k8s(self, top: _Proc, common: dict) -> Workload:
        uid = top.match.pod_uid
        assert uid is not None
        pod = self.pods.lookup(uid) if self.pods is not None else None
        if pod is None:
            return Workload(kind="k8s", pod_uid=uid, **common)
        container = pod.containers.get(top.match.container_id) if top.match.container_id else None
        return Workload(kind="k8s", job=pod.job, namespace=pod.namespace, pod=pod.name, pod_uid=pod.uid, container=container, **common)

    def _slurm(self, top: _Proc, members: list[tuple[GpuProcess, _Proc]], common: dict) -> Workload:
        assert top.slurm is not None
        job_id = top.slurm.job_id
        # Any member's environ may name the job (the top process's may be unreadable).
        named = next((p.slurm for _, p in members if p.slurm is not None and (p.slurm.name or p.slurm.user)), None)
        if named is None and self.slurm is not None:
            named = self.slurm.lookup(job_id)
        return Workload(kind="slurm", job=named.name if named else None, user=named.user if named else None,
                        slurm_job_id=job_id, slurm_step=top.slurm_step, **common)


def _dominance(item: tuple[tuple[str, str | int], list[tuple[GpuProcess, _Proc]]]) -> tuple[int, int, int, int]:
    (kind, _), members = item
    memory = sum(gp.used_bytes or 0 for gp, _ in members)
    return memory, len(members), _KIND_RANK[kind], -min(gp.pid for gp, _ in members)
