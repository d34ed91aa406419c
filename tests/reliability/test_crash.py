"""kill -9 of the collector during sustained ingest, on SQLite and on PostgreSQL: after a
restart every acknowledged sample is in the database, each once, and the detector resumes
where it stopped (the open episode is continued, not opened again, and judging reaches the
last instant)."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import text

from server.store.engine import make_engine
from tests.reliability.collector import CollectorProcess, PatientFleet, join_checked

# A collector process killed mid-ingest and restarted, three times over: half a minute to a minute each.
pytestmark = pytest.mark.slow

GPUS_PER_SAMPLE = 8


def wait_for(predicate, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := predicate():
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def episodes(engine) -> list[tuple]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text("SELECT node, gpu, cause, resolved_at IS NULL FROM episodes ORDER BY id"))]


def judged_until(engine) -> float:
    with engine.connect() as conn:
        return conn.execute(text("SELECT max(value) FROM detector_progress WHERE key LIKE 'judged%'")).scalar() or 0.0


def test_kill_9_during_ingest_loses_no_acknowledged_sample(database_url, tmp_path):
    crash_and_check(database_url, tmp_path, workers=1)


def test_kill_9_of_workers_and_writer_process_loses_no_acknowledged_sample(sqlite_url, tmp_path):
    # --workers 2 on SQLite: two HTTP workers and the writer process die together.
    crash_and_check(sqlite_url, tmp_path, workers=2)


def crash_and_check(database_url: str, tmp_path, *, workers: int) -> None:
    collector = CollectorProcess(database_url, tmp_path, workers=workers).start()
    engine = make_engine(collector.env["LAGGARD_DATABASE_URL"])
    t0 = float(int(time.time()) - 300)
    fleet = PatientFleet(collector.url, t0, hot={"n2": (3,)})
    try:
        fleet.push_instants(0, 12)
        wait_for(lambda: episodes(engine) == [("n2", 3, "thermal", True)], "the thermal episode to open")

        pushing = fleet.in_background(12, 40)
        wait_for(lambda: len(fleet.acked) >= 3 * 16, "ingest under way")
        collector.kill()
        failed_while_down = len(fleet.statuses)
        collector.start()
        join_checked(pushing)
        assert len(fleet.statuses) > failed_while_down
        assert any(s != 200 for s in fleet.statuses), "the crash went unnoticed: was the collector killed?"

        with engine.connect() as conn:
            stored = conn.execute(text(
                "SELECT n.name, s.ts, count(*) FROM gpu_samples s JOIN gpus g ON g.id = s.gpu_id JOIN nodes n ON n.id = g.node_id "
                "GROUP BY n.name, s.ts")).all()
        per_instant = {(node, ts): gpus for node, ts, gpus in stored}
        missing = fleet.acked - set(per_instant)
        assert not missing, f"acknowledged but not stored: {sorted(missing)[:5]}"
        assert all(gpus == GPUS_PER_SAMPLE for gpus in per_instant.values())

        wait_for(lambda: judged_until(engine) >= t0 + 39, "the detector to judge the last instant")
        assert episodes(engine) == [("n2", 3, "thermal", True)]  # continued across the crash, not reopened
    finally:
        collector.stop()
        engine.dispose()
