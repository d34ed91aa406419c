"""Reads what attribution needs of a process from <proc_root>/<pid>/: cgroup, comm, environ.

The seam is the root path, like the sysfs root of the InfiniBand reader: /proc on a node
(the agent needs the host's PID namespace, see docs/attribution.md), a fixture tree in the
tests. `cgroup` and `comm` are readable by anyone; `environ` only by the process's owner or
root with CAP_SYS_PTRACE (the kernel's ptrace read check), so it is read only when needed
(Slurm) and its failure is just a missing job name.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

DEFAULT_PROC_ROOT = "/proc"

# What environ is read for: the Slurm job of a process whose cgroup does not say (or to name it).
SLURM_ENV = ("SLURM_JOB_ID", "SLURM_JOB_NAME", "SLURM_JOB_USER", "SLURM_STEP_ID")

_CHUNK = 65536


def _read(path: str, limit: int | None = None) -> bytes:
    """The file's bytes (at most `limit`); raises OSError (ENOENT/ESRCH: the process is gone)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if limit is not None:
            return os.read(fd, limit)
        chunks = []
        while True:
            chunk = os.read(fd, _CHUNK)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)


def parse_environ(data: bytes, keys: Iterable[str] = SLURM_ENV) -> dict[str, str]:
    """The wanted variables of a NUL-separated environ block (the others are not decoded)."""
    wanted = {k.encode(): k for k in keys}
    out: dict[str, str] = {}
    for item in data.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep and name in wanted:
            out[wanted[name]] = value.decode("utf-8", "replace")
    return out


class ProcFs:
    """One process's cgroup, comm and environ under a /proc root. Every method raises OSError
    when the file cannot be read: the process has gone (FileNotFoundError, ProcessLookupError)
    or is not ours to read (PermissionError); callers count that and leave the fields null."""

    def __init__(self, root: str | os.PathLike[str] = DEFAULT_PROC_ROOT) -> None:
        self.root = os.fspath(root)

    def cgroup(self, pid: int) -> str:
        return _read(f"{self.root}/{pid}/cgroup").decode("utf-8", "replace")

    def comm(self, pid: int) -> str:
        # TASK_COMM_LEN is 16: the name, cut to 15 bytes, and a newline.
        return _read(f"{self.root}/{pid}/comm", 64).decode("utf-8", "replace").strip()

    def environ(self, pid: int, keys: Iterable[str] = SLURM_ENV) -> dict[str, str]:
        return parse_environ(_read(f"{self.root}/{pid}/environ"), keys)
