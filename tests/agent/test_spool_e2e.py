"""Losing nothing, end to end: the real agent (Runner, Pusher, DiskSpool) on simulated GPUs
pushes to a real collector (uvicorn, SQLite file); the collector goes away for a stretch of
sample time and comes back on the same port and database. Every sample taken is stored, once."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from agent.cli import simulated_sources
from agent.push import MemoryQueue, Pusher
from agent.runner import Runner
from agent.spool import DiskSpool
from server.app import create_app
from server.serve import RunningServer, start_in_thread
from server.settings import Settings
from server.store import schema
from server.store.engine import make_engine

REPO = Path(__file__).resolve().parents[2]
INTERVAL = 0.1  # seconds of sample time between samples
GPUS = 2


class Recorder:
    """A sink in front of the pusher that remembers every sample taken."""

    def __init__(self, pusher: Pusher) -> None:
        self.pusher = pusher
        self.samples = []

    def submit(self, sample) -> None:
        self.samples.append(sample)
        self.pusher.submit(sample)


class Agent:
    """One agent process's worth: spool, pusher thread, sampling thread."""

    def __init__(self, url: str, spool_dir: Path, sources, recorder_samples: list) -> None:
        self.spool = DiskSpool(spool_dir)
        self.resumed = len(self.spool)
        self.pusher = Pusher(url, node="spool-node", cluster="e2e", batch_size=5, max_delay=0.5, queue=self.spool,
                             timeout=2.0, backoff_base=0.05, backoff_max=0.3).start()
        self.recorder = Recorder(self.pusher)
        self.recorder.samples = recorder_samples
        self.stop = threading.Event()
        self.thread = Runner(sources.gpus, self.recorder, interval=INTERVAL, read_nics=sources.read_nics,
                             stop=self.stop).start()

    def stop_sampling(self) -> None:
        self.stop.set()
        self.thread.join(10)

    def close(self) -> None:
        self.stop_sampling()
        self.pusher.close(flush_timeout=0)
        self.spool.close()


def start_collector(database_url: str, port: int = 0) -> RunningServer:
    settings = Settings(database_url=database_url, retention_interval_s=3600, detection_enabled=False)
    return start_in_thread(create_app(settings), port=port)


def wait_until(pred, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not met within {timeout} s")
        time.sleep(0.02)


def stored(database_url: str) -> list[tuple[str, float, int]]:
    """(gpu uuid, ts, rows) for every stored (gpu, ts)."""
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            query = (select(schema.Gpu.uuid, schema.GpuSample.ts, func.count())
                     .join(schema.Gpu, schema.Gpu.id == schema.GpuSample.gpu_id)
                     .group_by(schema.Gpu.uuid, schema.GpuSample.ts))
            return [tuple(row) for row in conn.execute(query)]
    finally:
        engine.dispose()


def assert_each_sample_stored_once(database_url: str, samples: list) -> None:
    rows = stored(database_url)
    assert all(n == 1 for _, _, n in rows)
    taken = {(gpu.uuid, s.ts) for s in samples for gpu in s.gpus}
    assert len(taken) == GPUS * len(samples)
    assert {(uuid, ts) for uuid, ts, _ in rows} == taken


@pytest.fixture
def sources():
    src = simulated_sources("H100", GPUS, [], node="spool-node")
    yield src
    src.close()


def outage(agent: Agent, samples: list, seconds_of_samples: float) -> None:
    """Keep sampling while the collector is away, until pushes have failed and time has passed."""
    before = len(samples)
    wait_until(lambda: agent.pusher.stats.failed_attempts >= 2, what="pushes failing")
    wait_until(lambda: len(samples) >= before + seconds_of_samples / INTERVAL, what="sampling during the outage")


def test_collector_outage_every_sample_arrives_once(tmp_path, sqlite_url, sources):
    server = start_collector(sqlite_url)
    samples: list = []
    agent = Agent(server.url, tmp_path / "spool", sources, samples)
    try:
        wait_until(lambda: agent.pusher.stats.sent_samples >= 10, what="first pushes stored")
        server.stop()
        outage(agent, samples, seconds_of_samples=2.0)
        assert len(agent.spool) >= 10  # waiting on disk
        server = start_collector(sqlite_url, port=server.port)
        more = len(samples) + 10
        wait_until(lambda: len(samples) >= more, what="sampling after the outage")
        agent.stop_sampling()
        wait_until(lambda: len(agent.spool) == 0, what="back-fill")
        assert agent.spool.dropped == 0
    finally:
        agent.close()
    try:
        assert_each_sample_stored_once(sqlite_url, samples)
        # The collector stores a resent sample once: send the first few again.
        again = Pusher(server.url, node="spool-node", cluster="e2e", batch_size=5, queue=MemoryQueue())
        for s in samples[:5]:
            again.submit(s)
        assert again.flush(10) and again.stats.sent_samples == 5
        again.close()
        assert_each_sample_stored_once(sqlite_url, samples)
    finally:
        server.stop()


def test_agent_restarts_while_the_collector_is_away(tmp_path, sqlite_url, sources):
    server = start_collector(sqlite_url)
    samples: list = []
    first = Agent(server.url, tmp_path / "spool", sources, samples)
    second = None
    try:
        wait_until(lambda: first.pusher.stats.sent_samples >= 10, what="first pushes stored")
        server.stop()
        outage(first, samples, seconds_of_samples=1.0)
        first.close()  # the agent stops (upgrade, node reboot) with the collector still away
        second = Agent(server.url, tmp_path / "spool", sources, samples)
        assert second.resumed >= 10
        outage(second, samples, seconds_of_samples=1.0)
        server = start_collector(sqlite_url, port=server.port)
        wait_until(lambda: second.pusher.stats.sent_samples >= second.resumed, what="back-fill after restart")
        second.stop_sampling()
        wait_until(lambda: len(second.spool) == 0, what="back-fill")
    finally:
        first.close()
        if second is not None:
            second.close()
        server.stop()
    assert_each_sample_stored_once(sqlite_url, samples)


def test_killed_agent_process_resumes_its_spool(tmp_path):
    """The real command: an agent killed with SIGKILL while the collector is away leaves its
    samples on disk; the next agent process sends them first, in order."""
    from tests.agent.test_push import Collector, free_port

    port, spool_dir = free_port(), tmp_path / "spool"
    cmd = [sys.executable, "-m", "agent.cli", "--simulate", "H100:2", "--interval", "0.2", "--batch", "2",
           "--collector", f"http://127.0.0.1:{port}", "--node", "kill-node", "--spool-dir", str(spool_dir)]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    shm = Path("/dev/shm")
    before = set(shm.glob("laggard-sim-*-kill-node-*"))
    first = subprocess.Popen(cmd, cwd=REPO, env=env, stderr=subprocess.DEVNULL)
    try:
        # A record is about 4 kB (2 GPUs, 8 ports); the kill may tear the last one, which is then
        # not a sample: wait for room for several more than the 5 asserted below.
        wait_until(lambda: sum(p.stat().st_size for p in spool_dir.glob("seg-*.log")) > 8 * 4000,
                   what="samples spooled by the first agent")
    finally:
        first.kill()
        first.wait(30)
        # The simulated node's counter and /proc trees, which a process killed so cannot remove.
        for left_behind in set(shm.glob("laggard-sim-*-kill-node-*")) - before:
            shutil.rmtree(left_behind, ignore_errors=True)
    with DiskSpool(spool_dir) as spool:
        left = [s.ts for _, s in spool.peek(10_000)]
    assert len(left) >= 5 and left == sorted(left)
    collector = Collector(port=port)
    second = subprocess.Popen(cmd, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: len(received(collector)) >= len(left) + 2, what="back-fill by the second agent")
    finally:
        second.send_signal(signal.SIGTERM)
        _, stderr = second.communicate(timeout=30)
        collector.close()
    assert second.returncode == 0, stderr
    got = received(collector)
    assert got[:len(left)] == left  # the killed agent's samples first, oldest first
    assert got == sorted(got) and len(set(got)) == len(got)
    assert all(b["json"]["node"] == "kill-node" for b in collector.requests)


def received(collector) -> list[float]:
    return [s["ts"] for r in list(collector.requests) for s in r["json"]["samples"]]
