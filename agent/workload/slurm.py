"""Slurm job name and user: from the process's environment first, else `scontrol -o show job <id>`.

The job id (and step) come from the cgroup path (agent.workload.cgroup); a process's environ
has SLURM_JOB_ID, SLURM_JOB_NAME, SLURM_JOB_USER and SLURM_STEP_ID (readable when the agent
runs as root), and is believed only when its SLURM_JOB_ID is the cgroup's job (an ssh session
adopted into a job by pam_slurm_adopt may carry another job's variables, or none).

`Scontrol` is optional (a binary path setting); it asks once per job id, off the sampling
thread, caches the answer, and after a failure asks again no sooner than `retry_s`.
"""

from __future__ import annotations

import logging
import re
import subprocess
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from agent.workload.background import Worker

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SlurmJob:
    job_id: str
    name: str | None = None
    user: str | None = None


def job_from_environ(env: Mapping[str, str]) -> tuple[SlurmJob | None, str | None]:
    """(job, step) from SLURM_* variables; (None, None) when SLURM_JOB_ID is absent."""
    job_id = (env.get("SLURM_JOB_ID") or "").strip()
    if not job_id:
        return None, None
    step = (env.get("SLURM_STEP_ID") or "").strip() or None
    return SlurmJob(job_id, env.get("SLURM_JOB_NAME") or None, env.get("SLURM_JOB_USER") or None), step


# A new field starts at whitespace followed by Key= (Slurm keys: "JobId", "MCS_label",
# "Socks/Node", "NtasksPerN:B:S:C"); values may hold '=' (TRES=cpu=4,mem=16G) and spaces (JobName).
_FIELD_START = re.compile(r"\s+(?=[A-Za-z][A-Za-z0-9_:/.]*=)")


def parse_show_job(text: str) -> dict[str, str]:
    """Key → value of one job in `scontrol -o show job` output (the first line)."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    fields: dict[str, str] = {}
    for item in _FIELD_START.split(line):
        key, sep, value = item.partition("=")
        if sep and key not in fields:
            fields[key] = value.strip()
    return fields


def job_from_show(text: str) -> SlurmJob | None:
    fields = parse_show_job(text)
    job_id = fields.get("JobId")
    if not job_id:
        return None
    user = fields.get("UserId") or None  # "alice(1000)"
    if user:
        user = user.split("(", 1)[0] or None
    name = fields.get("JobName") or None
    return SlurmJob(job_id, name, user)


class Scontrol:
    """lookup(job_id) → SlurmJob | None via `<binary> -o show job <id>`; `errors["scontrol_failed"]`
    counts failed runs (no such job any more, slurmctld unreachable, timeout, unparsable)."""

    MAX_JOBS = 1024

    def __init__(self, binary: str = "scontrol", *, timeout_s: float = 5.0, retry_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic, background: bool = True) -> None:
        self.binary = binary
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self._clock = clock
        self._jobs: OrderedDict[str, SlurmJob] = OrderedDict()
        self._asked: dict[str, float] = {}
        self.runs = 0
        self.errors = {"scontrol_failed": 0}
        self._worker = Worker(lambda job_id: self.ask(str(job_id)), name="scontrol", background=background)

    def lookup(self, job_id: str) -> SlurmJob | None:
        job = self._jobs.get(job_id)
        if job is not None:
            return job
        now = self._clock()
        asked = self._asked.get(job_id)
        if asked is None or now - asked >= self.retry_s:
            self._asked[job_id] = now
            self._worker.request(job_id)
            return self._jobs.get(job_id)
        return None

    def ask(self, job_id: str) -> SlurmJob | None:
        """Run scontrol for one job now (normally the worker's job)."""
        self.runs += 1
        try:
            done = subprocess.run([self.binary, "-o", "show", "job", job_id], capture_output=True, text=True,
                                  timeout=self.timeout_s, check=False)
            job = job_from_show(done.stdout) if done.returncode == 0 else None
            if job is None:
                raise RuntimeError(f"exit {done.returncode}: {(done.stderr or done.stdout).strip()[:200]}")
        except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
            self.errors["scontrol_failed"] += 1
            log.debug("scontrol show job %s failed: %s", job_id, exc)
            return None
        self._jobs[job_id] = job
        self._asked.pop(job_id, None)
        while len(self._jobs) > self.MAX_JOBS:
            self._jobs.popitem(last=False)
        if len(self._asked) > self.MAX_JOBS:
            self._asked.clear()
        return job

    def wait_idle(self, timeout: float = 10.0) -> bool:
        return self._worker.wait_idle(timeout)

    def close(self) -> None:
        self._worker.close()
