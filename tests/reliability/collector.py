"""A real `laggard server` process for the reliability tests, and an agent-like pusher that
re-sends a batch until it is acknowledged, remembering what was."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from tests.metrics.fleet import body
from tests.metrics.tools import free_port, wait_http
from tests.server.payloads import encode


class CollectorProcess:
    def __init__(self, database_url: str, log_dir: Path, *, port: int | None = None, workers: int = 1, env: dict[str, str] | None = None):
        self.database_url, self.log_dir, self.workers = database_url, log_dir, workers
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = os.environ | {
            "LAGGARD_DATABASE_URL": database_url, "LAGGARD_PORT": str(self.port), "LAGGARD_WORKERS": str(workers),
            "LAGGARD_DETECTION__OPEN_AFTER_S": "0", "LAGGARD_DETECTION_POLL_S": "0.05", "LAGGARD_RETENTION_INTERVAL_S": "3600",
        } | (env or {})
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> CollectorProcess:
        self.starts += 1
        with open(self.log_dir / f"collector-{self.port}-{self.starts}.log", "w") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "server.cli", "--log-level", "info", "server"], env=self.env,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_http(f"{self.url}/readyz", timeout=60, proc=self.proc)
        return self

    def kill(self) -> None:
        """kill -9 of the whole process group (workers and writer too): a crash, not a shutdown."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise

    def log(self) -> str:
        return "\n".join(p.read_text() for p in sorted(self.log_dir.glob(f"collector-{self.port}-*.log")))


class PatientFleet:
    """Nodes pushing one instant at a time; a batch that fails (connection refused, 503) is
    sent again until acknowledged, as the agent does. `acked` holds (node, ts) of every 200."""

    def __init__(self, url: str, t0: float, nodes: tuple[str, ...] = ("n1", "n2", "n3"), hot: dict[str, tuple[int, ...]] | None = None):
        self.url, self.t0, self.nodes, self.hot = url, t0, nodes, hot or {}
        self.acked: set[tuple[str, float]] = set()
        self.statuses: list[int | str] = []
        self._lock = threading.Lock()

    def push_instants(self, start: int, stop: int, *, give_up_s: float = 120.0) -> None:
        with httpx.Client(timeout=30) as client:
            for k in range(start, stop):
                for node in self.nodes:
                    self._push_until_acked(client, node, self.t0 + k, give_up_s)

    def _push_until_acked(self, client: httpx.Client, node: str, ts: float, give_up_s: float) -> None:
        content, headers = encode(body(node, ts, self.t0, hot_gpus=self.hot.get(node, ())), gzipped=True)
        deadline = time.monotonic() + give_up_s
        while time.monotonic() < deadline:
            try:
                status: int | str = client.post(f"{self.url}/api/v1/samples", content=content, headers=headers).status_code
            except httpx.TransportError as exc:
                status = type(exc).__name__
            with self._lock:
                self.statuses.append(status)
                if status == 200:
                    self.acked.add((node, ts))
                    return
            time.sleep(0.05)
        raise AssertionError(f"{node} at {ts} never acknowledged; last answers {self.statuses[-5:]}")

    def in_background(self, start: int, stop: int) -> threading.Thread:
        errors: list[BaseException] = []

        def run() -> None:
            try:
                self.push_instants(start, stop)
            except BaseException as exc:  # noqa: BLE001 (re-raised by join_checked)
                errors.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        thread.errors = errors  # type: ignore[attr-defined]
        thread.start()
        return thread


def join_checked(thread: threading.Thread, timeout: float = 180.0) -> None:
    thread.join(timeout)
    assert not thread.is_alive(), "pushing did not finish"
    if thread.errors:  # type: ignore[attr-defined]
        raise thread.errors[0]  # type: ignore[attr-defined]


def stored_gpu_samples(database_url: str) -> set[tuple[str, float]]:
    """(GPU uuid, ts) of every GPU sample in the database."""
    from sqlalchemy import text

    from server.store.engine import make_engine

    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            return set(conn.execute(text("SELECT g.uuid, s.ts FROM gpu_samples s JOIN gpus g ON g.id = s.gpu_id")).all())
    finally:
        engine.dispose()


def sample_keys(bodies) -> set[tuple[str, float]]:
    """(GPU uuid, ts) of every GPU sample in these request bodies."""
    return {(g["uuid"], s["ts"]) for b in bodies for s in b["samples"] for g in s["gpus"]}
