"""A real Slurm on loopback for the tests: munged with its own key and socket, a slurmctld and one
`slurmd -N <name>` per node, each on a free port, everything (config, state, spool, logs) in one
temporary directory and SLURM_CONF pointing at the generated slurm.conf.

Missing binaries or a start that fails: a failure under CI (CI set; .ci/run installs Debian's
slurmctld, slurmd, slurm-client and munge), a skip locally. Every daemon runs in the foreground
as a child of the test, so stop() ends exactly those processes, whatever happened."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from server.hints.slurm_sync import parse_show_node

BINARIES = ("munged", "slurmctld", "slurmd", "scontrol", "sinfo")


def unavailable(reason: str):
    if os.environ.get("CI"):
        pytest.fail(f"real Slurm required under CI: {reason}")
    pytest.skip(f"real Slurm unavailable: {reason}")


def free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


SLURM_CONF = """\
ClusterName=laggardtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/linear
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=300
{nodes}
PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
NODE_LINE = "NodeName={name} NodeAddr=127.0.0.1 NodeHostname={host} Port={port} CPUs=1 RealMemory=64 State=UNKNOWN"


class SlurmCluster:
    def __init__(self, root: Path, nodes: list[str]):
        self.root, self.nodes = root, nodes
        self.conf = root / "slurm.conf"
        self.munge_socket = root / "munge" / "munge.socket"
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    # --- start ------------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> None:
        missing = [b for b in BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]
        if missing:
            unavailable(f"not installed: {', '.join(missing)}")
        try:
            self._write_config()
            self._start_munge()
            self._spawn("slurmctld", [_bin("slurmctld"), "-D", "-i"])
            for name in self.nodes:
                self._spawn(f"slurmd {name}", [_bin("slurmd"), "-D", "-N", name])
            self._wait_idle(timeout)
        except BaseException:
            self.stop()
            raise

    def _write_config(self) -> None:
        for sub in ("state", "spool", "munge"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.root / "munge").chmod(0o700)
        host = socket.gethostname()
        ctld_port, *ports = free_ports(len(self.nodes) + 1)
        lines = [NODE_LINE.format(name=n, host=host, port=p) for n, p in zip(self.nodes, ports)]
        self.conf.write_text(SLURM_CONF.format(host=host, ctld_port=ctld_port, user=_user(), munge_socket=self.munge_socket,
                                               root=self.root, nodes="\n".join(lines)))

    def _start_munge(self) -> None:
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        m = self.root / "munge"
        self._spawn("munged", [_bin("munged"), "-F", "--force", f"--socket={self.munge_socket}", f"--key-file={key}",
                               f"--pid-file={m / 'munged.pid'}", f"--log-file={m / 'munged.log'}", f"--seed-file={m / 'munged.seed'}"])
        self._until(lambda: self.munge_socket.exists(), 10.0, "munged did not create its socket")

    def _spawn(self, label: str, argv: list[str]) -> None:
        with open(self.root / f"{label.replace(' ', '.')}.out", "wb") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        self.procs.append((label, proc))

    def _wait_idle(self, timeout: float) -> None:
        def idle() -> bool:
            states = self.states()
            return len(states) == len(self.nodes) and all(s.startswith("IDLE") for s in states.values())

        self._until(idle, timeout, "the Slurm nodes did not all come up IDLE")

    def _until(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [(label, p.returncode) for label, p in self.procs if p.poll() is not None]
            if dead:
                unavailable(f"{', '.join(f'{label} exited ({rc})' for label, rc in dead)}\n{self.logs()}")
            if ready():
                return
            time.sleep(0.2)
        unavailable(f"{what} within {timeout:.0f} s\n{self.logs()}")

    # --- use ----------------------------------------------------------------------------

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        tool, *rest = args
        result = subprocess.run([_bin(tool), *rest], check=False, capture_output=True, text=True, env=self.env, timeout=30)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed ({result.returncode}): {result.stderr}\n{self.logs()}")
        return result

    def show(self) -> dict[str, dict[str, str]]:
        return parse_show_node(self.run("scontrol", "show", "node").stdout)

    def states(self) -> dict[str, str]:
        result = self.run("scontrol", "show", "node", check=False)
        return {n: f["State"] for n, f in parse_show_node(result.stdout).items()} if result.returncode == 0 else {}

    def drain(self, node: str, reason: str) -> None:
        self.run("scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")

    def logs(self, tail: int = 40) -> str:
        parts = []
        for path in sorted(self.root.rglob("*.log")) + sorted(self.root.glob("*.out")):
            lines = path.read_text(errors="replace").splitlines()[-tail:]
            parts.append(f"--- {path.name} ---\n" + "\n".join(lines))
        return "\n".join(parts)

    # --- stop ---------------------------------------------------------------------------

    def stop(self) -> None:
        for _, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 10
        for _, proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()


def _bin(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name
