"""What a process's cgroup path says about its workload: pure functions over strings.

`/proc/<pid>/cgroup` has one line per hierarchy, `ID:CONTROLLERS:PATH`:

  cgroup v2 (unified)  0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice/cri-containerd-<id>.scope
  cgroup v1            12:memory:/kubepods/burstable/pod<uid>/<id>
                       1:name=systemd:/system.slice/slurmd.service
  hybrid               both kinds of line; the v2 one ("0::") may be just "/"

`classify_cgroup_file(text)` looks at every distinct path and keeps the one that says most.
What is recognised (docs/attribution.md has the full table):

- Kubernetes: a `kubepods` path (any prefix, e.g. kind's `kubelet.slice/kubelet-kubepods.slice`)
  with a `pod<uid>` segment. systemd driver: `kubepods-<qos>-pod<uid with _>.slice`;
  cgroupfs driver: `kubepods/<qos>/pod<uid>`; QoS burstable/besteffort, or none = guaranteed.
  A static pod's "uid" is its config hash (32 hex): the API knows it as the mirror annotation.
- Containers: `cri-containerd-<id>.scope` (containerd), `crio-<id>.scope` / `crio-<id>` (CRI-O),
  `docker-<id>.scope` / `docker/<id>` (Docker), `libpod-<id>.scope` (Podman),
  `nerdctl-<id>.scope` (nerdctl); a bare 64-hex segment under kubepods (containerd, cgroupfs driver).
- Slurm: a segment naming slurm (`slurm`, `slurm_<node>`, `slurmstepd.scope`,
  `<node>_slurmstepd.scope`) followed by `uid_<uid>` (v1), `job_<id>` and `step_<id>`
  (`step_0`, `step_batch`, `step_extern`, `step_interactive`).

Paths seen through a cgroup namespace ("0::/../../kubepods.slice/...") are handled the same:
"." and ".." segments are skipped, and nothing is anchored at the root.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32}"
# "pod<uid>" alone (cgroupfs) or at the end of a systemd slice name ("kubepods-besteffort-pod<uid>.slice").
_POD = re.compile(rf"(?:^|-)pod({_UID})(?:\.slice)?$")
_CONTAINER = re.compile(r"^(?:(cri-containerd|crio|docker|libpod|nerdctl)-)?([0-9a-f]{64})(?:\.scope)?$")
_RUNTIMES = {"cri-containerd": "containerd", "crio": "cri-o", "docker": "docker", "libpod": "podman", "nerdctl": "containerd"}
_QOS = ("burstable", "besteffort")
_SLURM_FIELD = re.compile(r"^(uid|job|step)_([^/]+)$")


@dataclass(frozen=True, slots=True)
class CgroupMatch:
    """What one cgroup path names; every field None when it names nothing known."""

    pod_uid: str | None = None  # with dashes, as the API server spells it (or a static pod's hash)
    qos: str | None = None  # guaranteed | burstable | besteffort (Kubernetes only)
    container_id: str | None = None  # 64 hex
    runtime: str | None = None  # containerd | cri-o | docker | podman; None when the path does not say
    slurm_job_id: str | None = None
    slurm_step: str | None = None  # "0", "batch", "extern", "interactive", ...
    slurm_uid: int | None = None  # cgroup v1 paths carry the job owner's uid

    @property
    def score(self) -> int:
        """How much this match says: a pod beats a Slurm job beats a bare container."""
        return ((8 if self.pod_uid else 0) + (4 if self.slurm_job_id else 0) + (2 if self.slurm_step else 0)
                + (1 if self.container_id else 0))


NOTHING = CgroupMatch()


def parse_cgroup_file(text: str) -> list[tuple[str, str]]:
    """(controllers, path) for each line of /proc/<pid>/cgroup; the v2 line has controllers ""."""
    entries = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[2].startswith("/"):
            entries.append((parts[1], parts[2].strip()))
    return entries


def _segments(path: str) -> list[str]:
    return [s for s in path.split("/") if s and s not in (".", "..")]


def _pod(segments: list[str]) -> tuple[str | None, str | None, int]:
    """(pod uid, qos, index of the pod segment) of a kubepods path; (None, None, -1) otherwise."""
    if not any("kubepods" in s for s in segments):
        return None, None, -1
    for i, seg in enumerate(segments):
        m = _POD.search(seg)
        if m is None:
            continue
        qos = "guaranteed"
        for before in segments[: i + 1]:
            for name in _QOS:
                if before == name or f"-{name}" in before:  # "burstable", "kubepods-burstable.slice", ...
                    qos = name
        return m.group(1).replace("_", "-"), qos, i
    return None, None, -1


def _container(segments: list[str]) -> tuple[str | None, str | None]:
    """(container id, runtime) from the last container-like segment (the innermost one)."""
    for i in range(len(segments) - 1, -1, -1):
        m = _CONTAINER.match(segments[i])
        if m is None:
            continue
        prefix, cid = m.group(1), m.group(2)
        if prefix:
            return cid, _RUNTIMES[prefix]
        if i > 0 and segments[i - 1] == "docker":  # Docker, cgroupfs driver: /docker/<id>
            return cid, "docker"
        if i > 0 and ("kubepods" in segments[0] or _POD.search(segments[i - 1])):  # kubepods/<qos>/pod<uid>/<id>
            return cid, None
        if i > 0 and segments[i - 1].startswith("crio"):
            return cid, "cri-o"
    return None, None


def _slurm(segments: list[str]) -> tuple[str | None, str | None, int | None]:
    """(job id, step, uid) after a segment naming slurm; Nones when there is none."""
    start = next((i for i, s in enumerate(segments) if "slurm" in s), None)
    if start is None:
        return None, None, None
    job = step = None
    uid = None
    for seg in segments[start + 1:]:
        m = _SLURM_FIELD.match(seg)
        if m is None:
            continue
        key, value = m.groups()
        if key == "uid" and value.isdigit() and job is None:
            uid = int(value)
        elif key == "job" and value.isdigit() and job is None:
            job = value
        elif key == "step" and job is not None and step is None:
            step = value
    if job is None:
        return None, None, None
    return job, step, uid


def classify_path(path: str) -> CgroupMatch:
    """What one cgroup path names (see the module docstring); NOTHING for a plain path."""
    segments = _segments(path)
    if not segments:
        return NOTHING
    pod_uid, qos, _ = _pod(segments)
    cid, runtime = _container(segments)
    job, step, uid = (None, None, None) if pod_uid else _slurm(segments)
    if not (pod_uid or cid or job):
        return NOTHING
    return CgroupMatch(pod_uid=pod_uid, qos=qos, container_id=cid, runtime=runtime, slurm_job_id=job, slurm_step=step, slurm_uid=uid)


def classify_cgroup_file(text: str) -> CgroupMatch:
    """The most telling match over all the hierarchies of a /proc/<pid>/cgroup file.

    On a hybrid or v1 host the controllers disagree: Slurm's cgroup plugin places a task in
    memory/devices/cpuset/freezer only, while name=systemd still says slurmd.service. The
    first line that says most wins; ties go to the line listed first."""
    best = NOTHING
    seen: set[str] = set()
    for _, path in parse_cgroup_file(text):
        if path in seen:
            continue
        seen.add(path)
        match = classify_path(path)
        if match.score > best.score:
            best = match
    return best
