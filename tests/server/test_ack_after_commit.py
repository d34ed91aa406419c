"""A 200 means the samples are committed: the answer waits for the commit, and what was
acknowledged is visible to an independent connection."""

from __future__ import annotations

import threading

import httpx
from sqlalchemy import text

from tests.server.conftest import stored_gpu_samples
from tests.server.payloads import batch, encode


def test_acknowledged_samples_are_visible_to_another_connection(live_server, db):
    content, headers = encode(batch(samples=4, gpus=8), gzipped=True)
    r = httpx.post(f"{live_server.url}/api/v1/samples", content=content, headers=headers, timeout=30)
    assert r.json() == {"accepted": 4}
    assert stored_gpu_samples(db) == 32


def test_the_answer_waits_while_the_database_cannot_commit(live_server, db):
    # Warm the id cache so the held lock below blocks only the sample insert itself.
    content, headers = encode(batch(samples=1), gzipped=True)
    assert httpx.post(f"{live_server.url}/api/v1/samples", content=content, headers=headers).status_code == 200
    before = stored_gpu_samples(db)

    answers: list[httpx.Response] = []
    with db.connect() as blocker:
        _hold_write_lock(blocker)
        later = encode(batch(samples=3, ts=1_700_000_000.0))
        poster = threading.Thread(
            target=lambda: answers.append(
                httpx.post(f"{live_server.url}/api/v1/samples", content=later[0], headers=later[1], timeout=60)
            )
        )
        poster.start()
        poster.join(1.5)
        assert poster.is_alive(), "acknowledged while the database was locked: not after commit"
        assert answers == []
        blocker.rollback()
    poster.join(60)
    assert answers and answers[0].status_code == 200, answers
    assert answers[0].json() == {"accepted": 3}
    assert stored_gpu_samples(db) == before + 6


def _hold_write_lock(conn) -> None:
    if conn.dialect.name == "sqlite":
        conn.exec_driver_sql("BEGIN IMMEDIATE")
    else:
        conn.execute(text("LOCK TABLE gpu_samples IN ACCESS EXCLUSIVE MODE"))
