"""401 and 403 are configuration errors: the real agent process against a real collector with
authentication on (over HTTP). An agent without --cluster pushes as its token's cluster; a
refused agent says once what to fix, keeps its samples in the spool and retries slowly without
a warning per attempt; once fixed (a restart with the right flag, a new token in its token
file) every spooled sample arrives."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from agent.spool import DiskSpool
from server.settings import Settings
from server.store import schema
from tests.agent.test_push import free_port
from tests.agent.test_spool_e2e import wait_until
from tests.auth.conftest import SecureCollector

REPO = Path(__file__).resolve().parents[2]
GPUS = 2


class AgentProcess:
    """`laggard-agent --simulate` with a spool and its own /metrics, logging to a file."""

    def __init__(self, tmp_path: Path, name: str, url: str, *flags: str) -> None:
        self.log = tmp_path / f"{name}.log"
        self.metrics_url = f"http://127.0.0.1:{free_port()}/metrics"
        cmd = [sys.executable, "-m", "agent.cli", "--simulate", f"H100:{GPUS}", "--interval", "0.2", "--batch", "1",
               "--collector", url, "--node", "n1", "--spool-dir", str(tmp_path / "spool"), "--auth-retry", "0.3",
               "--metrics-port", self.metrics_url.split("//")[1].removesuffix("/metrics"), *flags]
        env = {k: v for k, v in os.environ.items() if not k.startswith("LAGGARD_")} | {"PYTHONPATH": str(REPO)}
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=log)

    def metric(self, name: str) -> float:
        try:
            text = httpx.get(self.metrics_url, timeout=5).text
        except httpx.HTTPError:
            return 0.0
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))

    def lines(self, level: str) -> list[str]:
        """The pusher's log lines of one level (a busy test machine may make the sampler log
        skipped ticks; that is not what these tests are about)."""
        return [line for line in self.log.read_text().splitlines() if f" {level} agent.push: " in line]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(30) == 0, self.log.read_text()


@pytest.fixture
def collector(sqlite_url):
    c = SecureCollector(Settings(database_url=sqlite_url, insecure=False, token_cache_s=0, detection_enabled=False,
                                 retention_interval_s=3600))
    yield c
    c.close()


def stored(collector: SecureCollector) -> dict[tuple[str, str], set[float]]:
    """(cluster, node) -> the timestamps stored for it, every GPU's."""
    query = (select(schema.Node.cluster, schema.Node.name, schema.GpuSample.ts)
             .join(schema.Gpu, schema.Gpu.node_id == schema.Node.id).join(schema.GpuSample, schema.GpuSample.gpu_id == schema.Gpu.id))
    out: dict[tuple[str, str], set[float]] = {}
    with collector.engine.connect() as conn:
        for cluster, node, ts in conn.execute(query):
            out.setdefault((cluster, node), set()).add(ts)
    return out


def spooled(tmp_path: Path) -> list[float]:
    with DiskSpool(tmp_path / "spool") as spool:
        assert spool.dropped == 0
        return [s.ts for _, s in spool.peek(100_000)]


def refused_for_a_while(agent: AgentProcess) -> None:
    """Several refused attempts, with samples piling up in the spool meanwhile."""
    wait_until(lambda: agent.metric("laggard_agent_push_refusals_total") >= 5, timeout=60, what="refused attempts")
    assert agent.metric("laggard_agent_queued_samples") >= 5


def test_agent_without_cluster_pushes_as_its_tokens_cluster(collector, tmp_path):
    token = collector.token("agent", cluster="prod-a")
    agent = AgentProcess(tmp_path, "agent", collector.url, "--token", token)
    try:
        wait_until(lambda: len(stored(collector).get(("prod-a", "n1"), ())) >= 5, timeout=60, what="samples stored under prod-a")
        assert agent.metric("laggard_agent_push_refusals_total") == 0
        assert 'cluster="prod-a"' in httpx.get(agent.metrics_url, timeout=5).text  # its own /metrics agrees
    finally:
        agent.stop()
    assert set(stored(collector)) == {("prod-a", "n1")}
    assert agent.lines("WARNING") == [] and agent.lines("ERROR") == []
    assert any("pushing as cluster prod-a" in line for line in agent.lines("INFO"))


def test_wrong_cluster_says_once_what_to_fix_and_loses_nothing(collector, tmp_path):
    token = collector.token("agent", cluster="prod-a")
    wrong = AgentProcess(tmp_path, "wrong", collector.url, "--token", token, "--cluster", "prod-b")
    try:
        refused_for_a_while(wrong)
    finally:
        wrong.stop()
    [error] = wrong.lines("ERROR")
    assert "token is bound to cluster prod-a; run with --cluster prod-a" in error
    assert wrong.lines("WARNING") == [] and stored(collector) == {}
    waiting = spooled(tmp_path)
    assert len(waiting) >= 5
    # A restart with the right flag sends every spooled sample, then the new ones.
    right = AgentProcess(tmp_path, "right", collector.url, "--token", token, "--cluster", "prod-a")
    try:
        wait_until(lambda: set(waiting) < stored(collector).get(("prod-a", "n1"), set()), timeout=60, what="spooled samples stored")
    finally:
        right.stop()
    assert set(stored(collector)) == {("prod-a", "n1")}
    assert right.lines("WARNING") == [] and right.lines("ERROR") == []


def test_unknown_token_says_once_what_to_fix_until_its_file_holds_a_good_one(collector, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("lgd_000000000000_unknownsecret\n")
    agent = AgentProcess(tmp_path, "agent", collector.url, "--token-file", str(token_file))
    try:
        refused_for_a_while(agent)
        [error] = agent.lines("ERROR")
        assert "HTTP 401" in error and "laggard token create --scope agent" in error and "--token" in error
        assert agent.lines("WARNING") == [] and stored(collector) == {}
        token_file.write_text(collector.token("agent", cluster="prod-a") + "\n")  # a Secret fixed in place
        taken_before = time.time() - 1.0
        wait_until(lambda: agent.metric("laggard_agent_queued_samples") == 0 and len(stored(collector).get(("prod-a", "n1"), ())) >= 5,
                   timeout=60, what="spooled samples stored")
        assert agent.metric("laggard_agent_sent_samples_total") >= 5
        assert agent.metric("laggard_agent_dropped_samples_total") == 0 and agent.metric("laggard_agent_rejected_samples_total") == 0
    finally:
        agent.stop()
    assert min(stored(collector)[("prod-a", "n1")]) < taken_before  # the samples taken while refused arrived too
    assert len(agent.lines("ERROR")) == 1 and agent.lines("WARNING") == []
    assert any("collector accepts pushes again" in line for line in agent.lines("INFO"))
