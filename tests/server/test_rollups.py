"""Per-minute rollups (issue #17): closed minutes only, min/mean/max of gauges and the last value
of everything else, idempotent, resumable, late batches rolled up again; raw samples go after
their short horizon while rollups stay; /series says which it served. Both databases, samples
pushed through the real HTTP API."""

from __future__ import annotations

import math
import statistics
import time

import httpx
import pytest
from sqlalchemy import event, select, update

from server.store import rollups, schema
from server.store.retention import Horizons, apply_retention
from tests.server.payloads import batch, encode, gpu, nic

DELAY_S = 900.0
HOUR = 3600.0


def _push(url: str, body: dict) -> None:
    content, headers = encode(body, gzipped=True)
    r = httpx.post(f"{url}/api/v1/samples", content=content, headers=headers, timeout=30)
    assert r.status_code == 200, r.text


def _samples(node: str, stamps: list[float]) -> dict:
    """A body whose readings change with every sample: temperature and power up and down, the
    NVLink counter climbing, the port's counter too."""
    body = batch(node=node, samples=0, gpus=0)
    body["samples"] = [
        {"ts": ts, "gpus": [gpu(g, node=f"prod-a.{node}", temp_c=40.0 + (ts % 60) / 2 + g, power_w=300.0 + 10 * (int(ts) % 7),
                                sm_clock_mhz=1400 + int(ts) % 5, nvlink_tx_bytes_total=int(ts * 1000) + g)
                            for g in range(2)],
         "nics": [nic(tx_bytes_total=int(ts) * 7)]}
        for ts in stamps
    ]
    return body


def _rollup_rows(engine, table=schema.GpuRollupT) -> dict[tuple[int, int], dict]:
    with engine.connect() as conn:
        return {(row[0], row.minute): row._asdict() for row in conn.execute(select(table))}


def _expected(engine) -> dict[tuple[int, int], dict]:
    """What each (GPU, minute) rollup must hold, computed here from the raw rows."""
    raw = schema.GpuSample.__table__
    with engine.connect() as conn:
        rows = conn.execute(select(raw).order_by(raw.c.gpu_id, raw.c.ts)).all()
    minutes: dict[tuple[int, int], list] = {}
    for row in rows:
        minutes.setdefault((row.gpu_id, math.floor(row.ts / 60)), []).append(row)
    return {key: {"samples": len(rs), "temp_c_min": min(r.temp_c for r in rs), "temp_c_max": max(r.temp_c for r in rs),
                  "temp_c_mean": statistics.fmean(r.temp_c for r in rs), "power_w_mean": statistics.fmean(r.power_w for r in rs),
                  "sm_clock_mhz_min": min(r.sm_clock_mhz for r in rs), "nvlink_tx_bytes_total": rs[-1].nvlink_tx_bytes_total,
                  "power_limit_w": rs[-1].power_limit_w}
            for key, rs in minutes.items()}


def _assert_matches(rolled: dict, expected: dict, minutes: set[int]) -> None:
    assert {key for key in rolled} == {key for key in expected if key[1] in minutes}
    for key, row in rolled.items():
        want = expected[key]
        assert row["samples"] == want["samples"]
        assert row["nvlink_tx_bytes_total"] == want["nvlink_tx_bytes_total"]  # the minute's last value, not its max or sum
        assert row["power_limit_w"] == want["power_limit_w"]
        for name in ("temp_c_min", "temp_c_max", "temp_c_mean", "power_w_mean", "sm_clock_mhz_min"):
            assert row[name] == pytest.approx(want[name], rel=1e-6), name  # single precision


@pytest.fixture
def three_minutes(live_server, db):
    """Samples every 5 s over three whole minutes and half of a fourth, 20 minutes ago."""
    start = (math.floor(time.time() / 60) - 20) * 60
    _push(live_server.url, _samples("n1", [start + 5 * i + 0.25 for i in range(42)]))
    return start


def test_closed_minutes_hold_min_mean_max_and_the_last_value(three_minutes, db):
    first = three_minutes // 60
    now = three_minutes + 2 * 60 + DELAY_S + 1  # minutes first and first+1 are closed, first+2 is not

    written = rollups.roll_up(db, now=now, delay_s=DELAY_S, keep_raw_s=48 * HOUR)

    assert written == {"gpu_rollups": 4, "nic_rollups": 2}
    _assert_matches(_rollup_rows(db), _expected(db), {first, first + 1})
    nic_rows = _rollup_rows(db, schema.NicRollupT)
    assert [row["tx_bytes_total"] for _, row in sorted(nic_rows.items())] == [int(three_minutes + 55.25) * 7,
                                                                           int(three_minutes + 115.25) * 7]


def test_running_again_or_after_a_crash_gives_the_same_rows(three_minutes, db):
    now = time.time()
    rollups.roll_up(db, now=now, delay_s=DELAY_S, keep_raw_s=48 * HOUR)
    once = _rollup_rows(db)
    assert rollups.roll_up(db, now=now, delay_s=DELAY_S, keep_raw_s=48 * HOUR) == {"gpu_rollups": 0, "nic_rollups": 0}
    # A crash after rows were written but before progress moved: the minutes are done again.
    with db.begin() as conn:
        conn.execute(update(rollups.ProgressT).values(through_minute=three_minutes // 60 - 5))
    assert rollups.roll_up(db, now=now, delay_s=DELAY_S, keep_raw_s=48 * HOUR)["gpu_rollups"] == 8
    assert _rollup_rows(db) == once
    _assert_matches(once, _expected(db), {three_minutes // 60 + i for i in range(4)})


def test_a_batch_stored_after_its_minutes_were_rolled_up_is_rolled_up_again(three_minutes, live_server, db):
    first = three_minutes // 60
    rollups.roll_up(db, now=time.time(), delay_s=DELAY_S, keep_raw_s=48 * HOUR)
    before = _rollup_rows(db)
    # An agent's spool replayed: samples of the first minute that the first push lacked.
    _push(live_server.url, _samples("n1", [three_minutes + 5 * i + 2.5 for i in range(12)]))

    rollups.roll_up(db, now=time.time(), delay_s=DELAY_S, keep_raw_s=48 * HOUR)

    after = _rollup_rows(db)
    assert {key: row["samples"] for key, row in after.items() if key[1] == first} == {key: 24 for key in before if key[1] == first}
    _assert_matches(after, _expected(db), {first + i for i in range(4)})


def test_raw_samples_go_after_their_horizon_rollups_stay(three_minutes, live_server, db):
    rollups.roll_up(db, now=time.time(), delay_s=DELAY_S, keep_raw_s=48 * HOUR)
    rolled = _rollup_rows(db)
    horizons = Horizons(raw_s=600, rollup_s=30 * 86400, events_s=365 * 86400)

    # Two days on (PostgreSQL drops a day partition once all of it is past the horizon).
    deleted = apply_retention(db, now=time.time() + 2 * 86400, horizons=horizons)

    assert deleted["gpu_samples"] == 84 and deleted["gpu_rollups"] == 0
    assert _rollup_rows(db) == rolled
    later = apply_retention(db, now=time.time() + 31 * 86400, horizons=horizons)
    assert later["gpu_rollups"] == 8 and later["nic_rollups"] == 4


def _series(url: str, **params) -> dict:
    r = httpx.get(f"{url}/api/v1/gpus/GPU-prod-a.n1-0001/series", params=params, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def test_series_serves_raw_samples_or_rollups_and_says_which(three_minutes, live_server, db):
    rollups.roll_up(db, now=three_minutes + 2 * 60 + DELAY_S + 1, delay_s=DELAY_S, keep_raw_s=48 * HOUR)
    since, until = three_minutes, three_minutes + 300
    expected = _expected(db)
    with db.connect() as conn:
        gpu_id = conn.execute(select(schema.Gpu.id).where(schema.Gpu.uuid == "GPU-prod-a.n1-0001")).scalar_one()

    raw = _series(live_server.url, metric="temp_c", since=since, until=until)
    assert raw["resolution"] == "raw" and raw["columns"] == ["ts", "value"] and len(raw["points"]) == 42

    minutes = _series(live_server.url, metric="temp_c", since=since, until=until, resolution="1m")
    assert minutes["resolution"] == "1m" and minutes["columns"] == ["ts", "mean", "min", "max"]
    # Two minutes rolled up, the two after computed from raw samples: the series reaches the present.
    assert [p[0] for p in minutes["points"]] == [three_minutes + 60 * i for i in range(4)]
    for ts, mean, low, high in minutes["points"]:
        want = expected[(gpu_id, int(ts // 60))]
        assert (mean, low, high) == pytest.approx((want["temp_c_mean"], want["temp_c_min"], want["temp_c_max"]), rel=1e-6)
    counter = _series(live_server.url, metric="nvlink_tx_bytes_total", since=since, until=until, resolution="1m")
    assert counter["columns"] == ["ts", "value"]
    assert [p[1] for p in counter["points"]] == [expected[(gpu_id, m)]["nvlink_tx_bytes_total"] for m in range(since // 60, since // 60 + 4)]

    # A week back is past the raw horizon: auto serves rollups.
    week = _series(live_server.url, metric="temp_c", since=time.time() - 7 * 86400)
    assert week["resolution"] == "1m" and len(week["points"]) == 4


def test_an_unknown_resolution_is_a_422_naming_it(live_server, three_minutes):
    r = httpx.get(f"{live_server.url}/api/v1/gpus/GPU-prod-a.n1-0001/series", params={"metric": "temp_c", "resolution": "5m"})
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["query", "resolution"]


def test_raw_samples_are_never_aggregated_inside_a_write_transaction(three_minutes, db):
    """SQLite has one writer: a transaction that wrote rollups while it aggregated raw samples
    held ingest's write lock for the whole aggregation (fleet p99 beside the hostile load went
    from ~85 to 500-850 ms). Each transaction here either reads raw samples or writes rollups."""
    transactions: list[list[str]] = []
    current: dict[int, list[str]] = {}

    def begin(conn):
        current[id(conn)] = []
        transactions.append(current[id(conn)])

    def statement(conn, _cursor, sql, *_args):
        current.setdefault(id(conn), []).append(sql)

    event.listen(db, "begin", begin)
    event.listen(db, "before_cursor_execute", statement)
    try:
        rollups.roll_up(db, now=time.time(), delay_s=DELAY_S, keep_raw_s=48 * HOUR)
    finally:
        event.remove(db, "begin", begin)
        event.remove(db, "before_cursor_execute", statement)

    def reads_raw(sql: str) -> bool:
        return "FROM gpu_samples" in sql or "FROM nic_samples" in sql

    def writes_rollups(sql: str) -> bool:
        return sql.lstrip().upper().startswith("INSERT INTO") and "_rollups" in sql.split("(")[0]

    assert any(writes_rollups(sql) for t in transactions for sql in t)
    for t in transactions:
        assert not (any(map(reads_raw, t)) and any(map(writes_rollups, t))), t
