"""The screen (server/detect/screen.py) only saves work: on realistic fleets with faults of
every cause, at 5 s and 1 s, the engine finds exactly the same episodes — entity, cause,
onset, detection, resolution, severity, summary and evidence — with and without it."""

from __future__ import annotations

import pytest

from bench.fleetgen import CAUSES, Fleet, FleetConfig
from bench.judge import instant_by_instant, judge, samples_of
from server.detect import engine


def _without_ids(episodes: list[dict]) -> list[dict]:
    return [{k: v for k, v in e.items() if k != "id"} for e in episodes]


@pytest.fixture(scope="module", params=[(5.0, 2700.0, 11), (1.0, 1200.0, 12)], ids=["5s", "1s"])
def fleet_bodies(request):
    interval, duration, seed = request.param
    fleet = Fleet(FleetConfig(nodes=16, interval=interval, duration=duration, seed=seed, faults_per_cause=2))
    bodies = instant_by_instant(samples_of(fleet, 6))
    return fleet, bodies, judge(bodies, screen=False)


def test_the_fleet_holds_faults_of_every_cause(fleet_bodies):
    fleet, _, unscreened = fleet_bodies
    assert {f.cause for f in fleet.truth} == set(CAUSES)
    assert {e["cause"] for e in unscreened} >= set(CAUSES) - {"lost"}, "a comparison where little is found proves little"


def test_screened_engine_finds_the_same_episodes(fleet_bodies):
    _, bodies, unscreened = fleet_bodies
    assert _without_ids(judge(bodies)) == _without_ids(unscreened)


@pytest.mark.parametrize("blind", ["gpu_may_find", "nic_may_find"])
def test_a_screen_blind_to_a_trigger_is_caught(fleet_bodies, monkeypatch, blind):
    # The comparison above can fail: a screen that misses what only it lets through changes
    # the episodes.
    _, bodies, unscreened = fleet_bodies
    monkeypatch.setattr(engine, blind, lambda obs, *_: bool(getattr(obs, "lost", False)))
    assert _without_ids(judge(bodies)) != _without_ids(unscreened)
