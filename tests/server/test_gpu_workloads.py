"""What uses each GPU (issue #15 item 2), from the wire to gpu_workloads and back, on SQLite and
PostgreSQL: stored as changes, not repeats; nothing from older agents; served by the node and
GPU endpoints."""

from __future__ import annotations

import time

import httpx
import pytest
from sqlalchemy import select

from server.errors import ApiError
from server.ingest.decode import parse_batch
from server.protocol import WORKLOAD_FIELDS
from server.store import schema, workloads
from server.store.samples import unresolved_rows
from server.store.slices import split
from tests.server.conftest import count_rows
from tests.server.payloads import batch, encode

POD_A = {"kind": "k8s", "job": "llm-a", "namespace": "team-a", "pod": "llm-a-worker-3", "pod_uid": "6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b",
         "container": "trainer", "container_id": "0123456789abcdef" * 4, "slurm_job_id": None, "slurm_step": None, "user": None,
         "process": "python3", "pid": 4242, "processes": 1, "workloads": 1}
SLURM_B = {"kind": "slurm", "job": "llm-b", "slurm_job_id": "4242", "slurm_step": "0", "user": "alice", "process": "python3",
           "pid": 77, "processes": 2, "workloads": 1}
IDLE = {"kind": None, "processes": 0, "workloads": 0}


def _full(workload: dict | None) -> dict | None:
    """As served: every wire key, null where not sent."""
    return None if workload is None else {k: workload.get(k) for k in WORKLOAD_FIELDS}


def _push(server, body) -> None:
    content, headers = encode(body)
    r = httpx.post(f"{server.url}/api/v1/samples", content=content, headers=headers, timeout=30)
    assert r.status_code == 200, r.text


def _body(ts: float, per_gpu: list, samples: int = 1) -> dict:
    """One batch; per_gpu[i]: GPU i's workload (..., the Ellipsis: key absent, an older agent)."""
    body = batch(gpus=len(per_gpu), samples=samples, ts=ts)
    for sample in body["samples"]:
        for g, workload in zip(sample["gpus"], per_gpu):
            if workload is not ...:
                g["workload"] = workload
    return body


def _stored(db) -> list[tuple]:
    t = schema.GpuWorkload.__table__
    with db.connect() as conn:
        rows = conn.execute(select(schema.Gpu.index, t).join(t, t.c.gpu_id == schema.Gpu.id).order_by(schema.Gpu.index, t.c.ts)).mappings().all()
    return [(r["index"], r["ts"], workloads.as_wire(r)) for r in rows]


def test_the_table_holds_the_wire_keys_in_order():
    assert [c.name for c in schema.GpuWorkload.__table__.columns] == ["gpu_id", "ts", *WORKLOAD_FIELDS]


def test_changes_only_on_both_databases_and_served(live_server, db):
    t0 = time.time() - 600
    for i in range(10):  # the same workloads ten times: one row per GPU
        _push(live_server, _body(t0 + i, [POD_A, IDLE, None, ...]))
    rows = _stored(db)
    assert rows == [(0, t0, _full(POD_A)), (1, t0, _full(IDLE))]  # unknown with nothing before, and absent: no row

    # A change is a new row; back to an earlier one too; a GPU that becomes unknown is stored so.
    _push(live_server, _body(t0 + 10, [SLURM_B, IDLE, None, ...]))
    _push(live_server, _body(t0 + 11, [SLURM_B, POD_A, None, ...]))
    _push(live_server, _body(t0 + 12, [None, POD_A, None, ...]))
    _push(live_server, _body(t0 + 13, [None, POD_A, None, ...]))
    assert _stored(db) == [
        (0, t0, _full(POD_A)), (0, t0 + 10, _full(SLURM_B)), (0, t0 + 12, None),
        (1, t0, _full(IDLE)), (1, t0 + 11, _full(POD_A)),
    ]
    # A re-sent batch stores nothing twice; a back-filled one is compared with what held then.
    _push(live_server, _body(t0 + 10, [SLURM_B, IDLE, None, ...]))
    _push(live_server, _body(t0 + 9.5, [POD_A, IDLE, None, ...]))
    assert count_rows(db, schema.GpuWorkload) == 5
    _push(live_server, _body(t0 + 12.5, [None, IDLE, None, ...]))  # late, and GPU 1 was not idle then
    assert _stored(db)[-1] == (1, t0 + 12.5, _full(IDLE))

    node = httpx.get(f"{live_server.url}/api/v1/nodes/gpu-node-001").json()
    served = [g["workload"] for g in node["gpus"]]
    assert served[0] is None  # unknown now
    # The late change at t0+12.5 is now the latest row: a back-filled change stands until the next one.
    assert served[1] == {"since": t0 + 12.5, **_full(IDLE)}
    assert served[2] is None and served[3] is None
    assert node["gpus"][1]["latest"]["ts"] == t0 + 13  # the readings beside it as before

    uuid = node["gpus"][0]["uuid"]
    r = httpx.get(f"{live_server.url}/api/v1/gpus/{uuid}/workloads", params={"since": t0 + 5, "until": t0 + 100}).json()
    assert [(w["since"], w["until"], w["workload"]) for w in r["workloads"]] == [
        (t0, t0 + 10, _full(POD_A)),  # the one in effect at `since`
        (t0 + 10, t0 + 12, _full(SLURM_B)),
        (t0 + 12, None, None),
    ]
    assert r["index"] == 0 and r["node"] == "gpu-node-001"
    r = httpx.get(f"{live_server.url}/api/v1/gpus/{uuid}/workloads", params={"since": t0 - 100, "until": t0 - 50}).json()
    assert r["workloads"] == []
    assert httpx.get(f"{live_server.url}/api/v1/gpus/GPU-nope/workloads").status_code == 404


def test_one_batch_keeps_its_own_changes_only(live_server, db):
    t0 = time.time() - 600
    body = _body(t0, [POD_A], samples=5)
    body["samples"][3]["gpus"][0]["workload"] = IDLE
    body["samples"][4]["gpus"][0]["workload"] = IDLE
    _push(live_server, body)
    assert _stored(db) == [(0, t0, _full(POD_A)), (0, t0 + 3, _full(IDLE))]


def test_an_older_agent_stores_no_workload(live_server, db):
    _push(live_server, _body(time.time() - 60, [..., ...], samples=3))
    assert count_rows(db, schema.GpuWorkload) == 0
    node = httpx.get(f"{live_server.url}/api/v1/nodes/gpu-node-001").json()
    assert [g["workload"] for g in node["gpus"]] == [None, None]
    assert all(g["latest"] is not None for g in node["gpus"])


def test_rows_of_a_batch_hold_changes_and_slices_carry_them():
    t0 = time.time() - 600
    body = _body(t0, [POD_A, ...], samples=6)
    body["samples"][4]["gpus"][0]["workload"] = IDLE
    body["samples"][5]["gpus"][0]["workload"] = IDLE
    rows = unresolved_rows(parse_batch(encode(body)[0], now=time.time(), max_future_skew_s=60))
    assert [(r[0], r[1], r[2]) for r in rows.workload_rows] == [(0, t0, "k8s"), (0, t0 + 4, "idle")]
    slices = split(rows, max_rows=2 * 2 + 2)  # ~2 instants per slice (2 GPUs + 1 NIC each)
    assert len(slices) > 1
    assert sorted(r[1] for s in slices for r in s.workload_rows) == [t0, t0 + 4]
    for s in slices:
        assert all(s.min_ts <= r[1] <= s.max_ts for r in s.workload_rows)


@pytest.mark.parametrize(("workload", "field", "words"), [
    ({"kind": "vm"}, "kind", "'k8s', 'slurm' or 'process'"),
    ({"kind": "k8s", "container_id": "abc"}, "container_id", "64 lowercase hex digits"),
    ({"kind": "k8s", "pod": "p" * 254}, "pod", "at most 253"),
    ({"kind": "k8s", "job": "j" * 257}, "job", "at most 256"),
    ({"kind": "k8s", "namespace": "a\nb"}, "namespace", "control characters"),
])
def test_a_bad_workload_is_a_422_naming_the_field(workload, field, words):
    body = _body(time.time() - 60, [IDLE, workload])
    with pytest.raises(ApiError) as caught:
        parse_batch(encode(body)[0], now=time.time(), max_future_skew_s=60)
    err = caught.value
    assert err.status == 422
    (detail,) = err.detail
    assert detail["loc"] == ["body", "samples", 0, "gpus", 1, "workload", field]
    assert words in detail["msg"], detail


def test_retention_keeps_the_workload_in_effect_at_the_horizon(live_server, db):
    from server.store.retention import Horizons, apply_retention

    now = time.time()
    day = 86400
    _push(live_server, _body(now - 30, [IDLE]))
    t = schema.GpuWorkload.__table__
    with db.begin() as conn:  # older changes of the same GPU, as if pushed days ago
        gpu_id = conn.execute(select(t.c.gpu_id)).scalar_one()
        conn.execute(t.insert(), [{"gpu_id": gpu_id, "ts": now - 9 * day, "kind": "k8s", "pod": "a"},
                                  {"gpu_id": gpu_id, "ts": now - 8 * day, "kind": "k8s", "pod": "b"},
                                  {"gpu_id": gpu_id, "ts": now - 2 * day, "kind": "slurm", "pod": None}])
    assert apply_retention(db, now=now, horizons=Horizons.same(7 * day))["gpu_workloads"] == 1  # "a": superseded before the horizon
    assert [(r[1], (r[2] or {}).get("pod")) for r in _stored(db)] == [(now - 8 * day, "b"), (now - 2 * day, None), (now - 30, None)]
