"""Nodes of two GPUs (cloud VMs, nodes shared by small jobs): no peers inside the node, so a slow
GPU is found against the GPUs of the other nodes (server/detect/across_window.py). Over windows
of 60 s, two to open, a clock or power-limit fault took one to two minutes to find (time to
detect p95 47 samples for clocks, 16 for power limits, at 5 s); over the gauge windows of 5 s, as
long as a fault on a node of eight GPUs."""

from __future__ import annotations

import pytest

from bench.detection import node_times, score
from bench.fleetgen import Fleet, FleetConfig
from bench.judge import judge, samples_of
from server.detect import across_window
from server.detect.settings import DetectionSettings


@pytest.fixture(scope="module")
def scored() -> dict:
    fleet = Fleet(FleetConfig(nodes=24, interval=5.0, duration=3600.0, seed=1, gpus_per_node=2))
    episodes = judge(samples_of(fleet, 6))
    return score(fleet.truth, episodes, interval=5.0, grace=120.0, times=node_times(fleet))


@pytest.mark.parametrize("cause", ["clock", "power"])
def test_clock_and_power_faults_of_small_nodes_are_found_within_four_samples(scored, cause):
    found = scored["causes"][cause]
    assert found["faults"] >= 5
    assert (found["recall"], found["precision"]) == (1.0, 1.0)
    assert found["ttd_p95"] <= 4


def test_a_node_with_peers_inside_takes_part_in_gauge_windows_once_a_minute(monkeypatch):
    """Its GPUs are judged inside the node at once; what it brings to the gauge windows (a whole
    node's limit, a reference for small nodes) waits for the minute: asked every 5 s, it cost
    the detector a quarter more CPU on a fleet of 8-GPU nodes."""
    from tests.detect.test_across import judge as judge_items
    from tests.detect.test_across import phased_fleet

    asked: dict[int, set[float]] = {}
    gauges = across_window.KINDS[1]

    def measure(members, start, end, cfg):
        asked.setdefault(len(members.gpus), set()).add(end)
        return gauges.measure(members, start, end, cfg)

    monkeypatch.setattr("server.detect.engine.KINDS", (across_window.KINDS[0], across_window.Kind(
        "gauges", gauges.width, measure, gauges.judge, big_nodes_each_minute=True)))
    items = sorted(phased_fleet(3, gpus=4, duration=600) + phased_fleet(3, gpus=1, duration=600, first=3), key=lambda i: i.ts)
    judge_items(items, DetectionSettings(lateness_s=120))
    assert asked[4] and all(end % 60 == 0 for end in asked[4])
    assert any(end % 60 for end in asked[1])
