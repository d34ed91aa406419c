"""The harness end to end on a tiny fleet: pushed through the real HTTP API of an in-process
collector, round by round, then read back."""

from __future__ import annotations

import json

from bench.baseline import FixedThresholdDetector
from bench.detection import Collector, fetch_episodes, http_get, push_fleet, score, wait_for_detection
from bench.fleetgen import Fleet, FleetConfig
from server.app import create_app
from server.serve import start_in_thread
from server.settings import Settings


def test_push_a_tiny_fleet_and_read_it_back(tmp_path):
    running = start_in_thread(create_app(Settings(database_url=f"sqlite:///{tmp_path / 'l.db'}", retention_interval_s=3600)))
    try:
        fleet = Fleet(FleetConfig(nodes=4, interval=5.0, duration=600.0, seed=2, t0=1_700_000_000.0 // 60 * 60,
                                  cluster="tiny", faults_per_cause=1))
        collector = Collector(running.url, tmp_path)
        baseline = FixedThresholdDetector()
        stats = push_fleet(fleet, collector, batch=6, clients=2, baselines=[baseline])
        assert stats.error is None
        assert stats.requests == 4 * 20 and 0.9 * 4 * 120 * 8 < stats.gpu_samples <= 4 * 120 * 8
        status, body = http_get(running.url, "/api/v1/nodes", {"cluster": "tiny"})
        assert status == 200 and len(json.loads(body)["nodes"]) == 4

        since, until = fleet.cfg.t0 - 1, fleet.t_end + 3600
        ok, note = wait_for_detection([(collector, {"tiny": fleet.t_end - 5.0})], since=since, until=until, timeout=60, settle=2)
        episodes = fetch_episodes(running.url, "tiny", since, until)
        if episodes is None:  # a collector without the stragglers API: the rest of the harness still works
            assert note == "no stragglers endpoint"
        else:
            assert ok, note
            sc = score(fleet.truth, episodes, interval=5.0, grace=120.0)
            assert sc["overall"]["faults"] == len(fleet.truth) > 0
        assert score(fleet.truth, baseline.finish(), interval=5.0, grace=120.0)["overall"]["episodes"] > 0
    finally:
        running.stop()
