"""Fleet-level series exported once however many replicas serve /metrics (issue #16 item 1).

Every replica reads the fleet from the shared database; only the replica whose process leads
detection exports it (server/metrics/exporter.py). Two replicas on one PostgreSQL under one real
Prometheus: every family has the series count of one replica, and every sum() equals one
replica's figure."""

from __future__ import annotations

import subprocess
import time
from collections import Counter

import httpx
import pytest
import yaml

from server.app import create_app
from server.detect.leader import LeaderLock
from server.detect.settings import DetectionSettings
from server.metrics.settings import MetricsSettings
from server.serve import start_in_thread
from server.settings import Settings
from server.store import migrate
from server.store.detector_state import leader_is
from server.store.engine import make_engine
from tests.dashboards.test_dashboards import SimulatedFleet, query
from tests.metrics.tools import free_port, require_binary, samples, wait_http

# Series whose values do not move between two scrapes a second apart once the fleet is warm.
STEADY_SUMS = ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "DCGM_FI_DEV_PCIE_MAX_LINK_GEN", "laggard_nodes_reporting", "laggard_gpu_nvlink_links")


def test_the_leader_names_its_replica_and_no_other(database_url):
    engine = make_engine(database_url)
    migrate.upgrade(engine)
    lock = LeaderLock(engine, replica="collector-0:8080")
    try:
        with engine.connect() as conn:
            assert leader_is(conn, "collector-0:8080") is None  # nobody leads yet
        assert lock.try_acquire()
        with engine.connect() as conn:
            assert leader_is(conn, "collector-0:8080") is True
            assert leader_is(conn, "collector-1:8080") is False
        lock.release()
        # Released by closing the lock's session: PostgreSQL drops its locks when that backend has
        # exited, a moment after the client hung up (it failed once, asked at once on a busy machine).
        deadline = time.monotonic() + 10
        while True:
            with engine.connect() as conn:
                leader = leader_is(conn, "collector-0:8080")
            if leader is None or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert leader is None
    finally:
        lock.release()
        engine.dispose()


def _families(text: str) -> Counter:
    return Counter(name for name, _ in samples(text))


@pytest.mark.timeout(240)
def test_two_replicas_under_one_prometheus_count_the_fleet_once(postgres_url, tmp_path):
    binary = require_binary("prometheus")
    replicas = []
    for name in ("collector-0", "collector-1"):  # two pods: two host names (start_in_thread picks its own port)
        settings = Settings(replica=name, database_url=postgres_url, detection=DetectionSettings(open_after_s=0), detection_poll_s=0.1,
                            metrics=MetricsSettings(flush_interval_s=0.5, process_series=False), leader_retry_s=0.5)
        replicas.append(start_in_thread(create_app(settings)))
    fleet = SimulatedFleet(replicas[0].url)
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "scrape_configs": [{
        "job_name": "laggard", "scrape_timeout": "1s",
        "static_configs": [{"targets": [r.url.removeprefix("http://") for r in replicas]}]}]}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    proc = subprocess.Popen([binary, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    prom = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{prom}/-/ready", proc=proc)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            stragglers = query(prom, "sum(laggard_straggler_active)")
            if stragglers and float(stragglers[0]["value"][1]) > 0 and query(prom, "count(DCGM_FI_DEV_GPU_TEMP) >= 32"):
                break
            time.sleep(1)
        else:
            raise AssertionError("the fleet never showed up in Prometheus with a straggler")
        time.sleep(3)  # every target scraped since

        texts = [httpx.get(f"{r.url}/metrics", timeout=30).text for r in replicas]
        exporting = [t for t in texts if "laggard_fleet_exporter{" in t and "DCGM_FI_DEV_GPU_TEMP{" in t]
        assert len(exporting) == 1, "exactly one replica exports the fleet"
        one = _families(exporting[0])
        assert one["DCGM_FI_DEV_GPU_TEMP"] == 32 and one["laggard_straggler_active"] > 0

        # What Prometheus holds from both targets, family by family: one replica's count.
        scraped = {r["metric"]["__name__"]: int(r["value"][1])
                   for r in query(prom, 'count by (__name__) ({job="laggard", __name__!~"up|scrape_.*"})')}
        doubled = {name: (n, one[name]) for name, n in scraped.items() if name != "laggard_fleet_exporter" and n != one[name]}
        assert not doubled, f"series counted more than once across replicas: {doubled}"
        assert scraped["laggard_fleet_exporter"] == 2
        assert float(query(prom, "sum(laggard_fleet_exporter)")[0]["value"][1]) == 1.0
        single = samples(exporting[0])
        for name in STEADY_SUMS:
            expected = sum(v for (n, _), v in single.items() if n == name)
            got = float(query(prom, f"sum({name})")[0]["value"][1])
            assert got == pytest.approx(expected), name
    finally:
        proc.terminate()
        proc.wait(15)
        fleet.close()
        for r in replicas:
            r.stop()
