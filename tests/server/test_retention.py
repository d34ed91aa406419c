"""Retention deletes by sample time, and only what is past the horizon."""

from __future__ import annotations

import time

import httpx
import pytest

from server.settings import Settings
from server.store import episode_events, episodes, schema
from server.store.retention import Horizons, apply_retention
from tests.server.conftest import count_rows, stored_gpu_samples
from tests.server.payloads import batch, encode

DAY = 86400.0


@pytest.fixture
def settings(database_url):
    # Retention is what is judged here: a detector in the same process would open (and,
    # as sample time moves on, resolve) an episode for the XID at its own pace, so the
    # count of episodes deleted would depend on whether it got there first.
    return Settings(database_url=database_url, retention_interval_s=3600, rollup_interval_s=3600, detector={"enabled": False})


def _push(url: str, body: dict) -> None:
    content, headers = encode(body, gzipped=True)
    r = httpx.post(f"{url}/api/v1/samples", content=content, headers=headers, timeout=30)
    assert r.status_code == 200, r.text


def test_old_samples_go_recent_ones_stay(live_server, db):
    now = time.time()
    old = batch(samples=3, gpus=2, ts=now - 8 * DAY)
    old["samples"][0]["gpus"][0]["xids"] = [{"xid": 79, "ts": now - 8 * DAY}]
    _push(live_server.url, old)
    recent = batch(samples=2, gpus=2, ts=now - 1 * DAY)
    recent["samples"][0]["gpus"][1]["xids"] = [{"xid": 48, "ts": now - DAY}]
    _push(live_server.url, recent)
    assert stored_gpu_samples(db) == 10

    deleted = apply_retention(db, now=now, horizons=Horizons.same(7 * DAY))

    assert deleted == {"gpu_samples": 6, "nic_samples": 3, "xid_events": 1, "gpu_workloads": 0, "ingest_log": 1, "episodes": 0,
                       "gpu_rollups": 0, "nic_rollups": 0, "episode_events": 0}
    assert stored_gpu_samples(db) == 4
    assert count_rows(db, schema.NicSample) == 2
    assert count_rows(db, schema.XidEvent) == 1
    # Inventory is kept: the node and its GPUs are still known.
    assert count_rows(db, schema.Gpu) == 2


def test_nothing_to_delete_is_a_no_op(live_server, db):
    _push(live_server.url, batch(samples=1))
    assert set(apply_retention(db, now=time.time(), horizons=Horizons.same(7 * DAY)).values()) == {0}
    assert stored_gpu_samples(db) == 2


def test_episode_events_past_the_horizon_go_whether_or_not_alerts_took_them(migrated_engine):
    """With alerts off nothing takes the events; they must not pile up for ever."""
    now = time.time()
    db = migrated_engine  # no collector: nothing but retention removes them
    with db.begin() as conn:
        for at in (now - 8 * DAY, now - DAY):
            ep = episodes.open_episode(conn, cluster="c", node="n", gpu=0, uuid="u", entity="gpu:u", cause="clock", severity="warning",
                                       onset=at, detected_at=at, evidence={}, summary="s")
            episode_events.record(conn, episode_id=ep, change="opened", now=at)
    assert apply_retention(db, now=now, horizons=Horizons.same(7 * DAY))["episode_events"] == 1
    assert count_rows(db, schema.EpisodeEvent) == 1


def test_raw_samples_are_kept_48_hours_unless_the_old_single_horizon_is_set():
    assert Settings().retention.raw_s == 48 * 3600
    assert Settings(raw_retention_hours=6).retention.raw_s == 6 * 3600
    assert Settings(retention_days=7).retention.raw_s == 7 * DAY  # LAGGARD_RETENTION_DAYS as before rollups
