"""The readings behind dcgm-exporter's default series (issue #16), from the wire to the database
and back, on SQLite and PostgreSQL: stored as sent, null where the agent sent null, and null
where an agent from before them does not send them at all."""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import select

from server.protocol import GPU_METRICS
from server.store import schema
from tests.server.payloads import batch, encode

NEW = {
    "energy_mj_total": 76_320_314_449,  # mJ: larger than 2**32
    "util_enc_pct": 12.0,
    "util_dec_pct": 80.5,
    "mem_reserved_bytes": 551 * 2**20,
    "remapped_rows_correctable_total": 2,
    "remapped_rows_uncorrectable_total": 1,
    "remapped_rows_failure": True,
    "gr_engine_active_pct": 97.25,
    "dram_active_pct": 44.5,
}


def test_the_new_keys_follow_the_older_ones_in_order_as_columns_too():
    # Readings are only ever appended (agent/fields.py): these after the first release's and
    # tensor_active_pct, before any added later (the video clock, migration 0012).
    at = GPU_METRICS.index(next(iter(NEW)))
    assert GPU_METRICS[at:at + len(NEW)] == tuple(NEW) and GPU_METRICS.index("tensor_active_pct") < at
    assert [c.name for c in schema.GpuSample.__table__.columns][2:] == list(GPU_METRICS)


def test_round_trip_on_both_databases(live_server, db):
    body = batch(gpus=3)
    gpus = body["samples"][0]["gpus"]
    gpus[0].update(NEW)  # a new agent on a Hopper GPU
    gpus[1].update(dict.fromkeys(NEW))  # a new agent where nothing is supported
    assert not set(NEW) & set(gpus[2])  # an agent from before these readings
    content, headers = encode(body)
    r = httpx.post(f"{live_server.url}/api/v1/samples", content=content, headers=headers, timeout=30)
    assert r.status_code == 200, r.text

    table = schema.GpuSample.__table__
    with db.connect() as conn:
        rows = conn.execute(select(schema.Gpu.uuid, *(table.c[k] for k in NEW))
                            .join(table, table.c.gpu_id == schema.Gpu.id).order_by(schema.Gpu.index)).all()
    assert [row[0] for row in rows] == [g["uuid"] for g in gpus]
    assert dict(zip(NEW, rows[0][1:])) == NEW
    assert rows[0][1:][list(NEW).index("remapped_rows_failure")] is True  # a bool, not 1
    assert list(rows[1][1:]) == [None] * len(NEW)
    assert list(rows[2][1:]) == [None] * len(NEW)
    # The older readings beside them are where they were (rows are bound by position).
    with db.connect() as conn:
        temp, power, clock = conn.execute(select(table.c.temp_c, table.c.power_w, table.c.sm_clock_mhz)).first()
    assert (temp, power, clock) == (61.0, 650.5, 1980)

    for key, value in NEW.items():
        got = []
        for g in gpus:
            series = httpx.get(f"{live_server.url}/api/v1/gpus/{g['uuid']}/series", params={"metric": key, "since": 0, "resolution": "raw"}).json()
            got += [v for _, v in series["points"]]
        assert got == [pytest.approx(value), None, None], key
