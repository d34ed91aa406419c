"""Detection end to end: samples pushed over HTTP, episodes served by the API, on SQLite and
PostgreSQL; episodes survive a restart; one detector per database."""

from __future__ import annotations

import logging
import time

import httpx
import pytest

from server.app import create_app
from server.detect.settings import DetectionSettings
from server.serve import start_in_thread
from server.settings import Settings
from tests.server.payloads import encode

# Recent sample times: retention (7 days) must not take them.
T0 = float(int(time.time()) - 3600)
HOT = 0x40  # HW thermal slowdown


def gpu(node: str, index: int, ts: float, *, hot: bool = False) -> dict:
    return {
        "index": index, "uuid": f"GPU-{node}-{index}", "model": "NVIDIA H100 80GB HBM3", "temp_c": 91.0 if hot else 64.0 + index * 0.3,
        "power_w": 600.0, "power_limit_w": 700.0, "sm_clock_mhz": 1400 if hot else 1980 - index, "sm_clock_max_mhz": 1980,
        "mem_clock_mhz": 2619, "mem_clock_max_mhz": 2619, "util_gpu_pct": 99.0, "util_mem_pct": 40.0,
        "clocks_event_reasons": HOT if hot else 0x4, "pcie_gen": 5, "pcie_gen_max": 5, "pcie_width": 16, "pcie_width_max": 16,
        "pcie_replay_total": 0, "nvlink_links_up": 18, "nvlink_links_total": 18,
        "nvlink_tx_bytes_total": int((ts - T0 + 1) * 5e10), "nvlink_rx_bytes_total": int((ts - T0 + 1) * 5e10),
        "nvlink_crc_errors_total": 0, "nvlink_replay_errors_total": 0, "nvlink_recovery_errors_total": 0,
        "ecc_corrected_total": 0, "ecc_uncorrected_total": 0, "remapped_rows_pending": False,
    }


def body(node: str, ts: float, *, hot_gpu: int | None = None) -> dict:
    return {
        "version": 1, "node": node, "cluster": "prod", "labels": {"job": "llm"},
        "samples": [{"ts": ts, "gpus": [gpu(node, i, ts, hot=(i == hot_gpu)) for i in range(8)], "nics": []}],
    }


def push(url: str, payload: dict) -> None:
    content, headers = encode(payload, gzipped=True)
    r = httpx.post(f"{url}/api/v1/samples", content=content, headers=headers, timeout=30)
    assert r.status_code == 200, r.text


def push_instants(url: str, start: int, stop: int, *, hot: bool) -> None:
    for k in range(start, stop):
        for node in ("n1", "n2"):
            push(url, body(node, T0 + k, hot_gpu=3 if hot and node == "n2" else None))


def wait_for(url: str, predicate, timeout: float = 10.0, path: str = "/api/v1/stragglers"):
    deadline = time.monotonic() + timeout
    while True:
        got = httpx.get(f"{url}{path}", timeout=10).json()["stragglers"]
        if predicate(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


@pytest.fixture
def settings(database_url):
    return Settings(database_url=database_url, detection=DetectionSettings(open_after_s=0, clear_after_s=0), detection_poll_s=0.05)


def test_a_hot_gpu_is_flagged_explained_and_resolved(settings):
    server = start_in_thread(create_app(settings))
    try:
        push_instants(server.url, 0, 5, hot=False)
        push_instants(server.url, 5, 8, hot=True)
        # How fast the flag appears is a benchmark figure (bench/flag_latency.py), not asserted here.
        active = wait_for(server.url, lambda s: len(s) > 0, timeout=10)
        assert [(s["node"], s["gpu"], s["cause"]) for s in active] == [("n2", 3, "thermal")]
        episode = active[0]
        assert episode["onset"] == T0 + 5 and episode["detected_at"] <= T0 + 7
        assert episode["uuid"] == "GPU-n2-3" and episode["resolved_at"] is None
        assert "1400" in episode["summary"] and "thermal" in episode["summary"].lower()

        push_instants(server.url, 8, 16, hot=False)
        assert wait_for(server.url, lambda s: s == []) == []
        history = wait_for(server.url, lambda s: True, path=f"/api/v1/stragglers/history?since={T0}&until={T0 + 100}")
        assert [(h["cause"], h["id"] == episode["id"], h["resolved_at"] is not None) for h in history] == [("thermal", True, True)]
    finally:
        server.stop()


def test_episodes_survive_a_restart_and_are_not_repeated(settings):
    server = start_in_thread(create_app(settings))
    try:
        push_instants(server.url, 0, 5, hot=False)
        push_instants(server.url, 5, 9, hot=True)
        first = wait_for(server.url, lambda s: len(s) == 1)
        assert len(first) == 1
    finally:
        server.stop()
    server = start_in_thread(create_app(settings))
    try:
        assert wait_for(server.url, lambda s: len(s) == 1) == first
        push_instants(server.url, 9, 12, hot=True)
        time.sleep(0.5)
        assert wait_for(server.url, lambda s: len(s) == 1) == first, "the restarted detector opened the episode again"
        push_instants(server.url, 12, 20, hot=False)
        assert wait_for(server.url, lambda s: s == []) == []
    finally:
        server.stop()


def test_two_collectors_on_one_database_run_one_detector(settings):
    a = start_in_thread(create_app(settings))
    b = start_in_thread(create_app(settings))
    try:
        for k in range(0, 10):
            for node, target in (("n1", a), ("n2", b)):
                push(target.url, body(node, T0 + k, hot_gpu=3 if node == "n2" and k >= 5 else None))
        found = wait_for(a.url, lambda s: len(s) >= 1)
        time.sleep(0.5)
        history = wait_for(b.url, lambda s: True, path=f"/api/v1/stragglers/history?since={T0}&until={T0 + 100}")
        assert [(h["node"], h["gpu"], h["cause"]) for h in history] == [("n2", 3, "thermal")], history
        assert found
    finally:
        a.stop()
        b.stop()


def test_stragglers_filters_and_bad_ranges(settings):
    server = start_in_thread(create_app(settings))
    try:
        push_instants(server.url, 0, 5, hot=False)
        push_instants(server.url, 5, 9, hot=True)
        wait_for(server.url, lambda s: len(s) == 1)
        def get(path, **params):
            return httpx.get(f"{server.url}{path}", params=params, timeout=10)

        assert len(get("/api/v1/stragglers", cause="thermal").json()["stragglers"]) == 1
        assert get("/api/v1/stragglers", cause="network").json()["stragglers"] == []
        assert get("/api/v1/stragglers", node="n1").json()["stragglers"] == []
        assert get("/api/v1/stragglers", cause="bogus").status_code == 422
        r = get("/api/v1/stragglers/history", since=10, until=5)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "since"]
    finally:
        server.stop()


def test_a_sample_arriving_after_its_instant_was_judged_is_counted_and_named(settings, caplog):
    caplog.set_level(logging.WARNING, logger="server.detect.service")

    def named() -> list[str]:
        return [r.getMessage() for r in caplog.records if "node n3 (cluster prod) arrived after their instant was judged" in r.getMessage()]

    server = start_in_thread(create_app(settings))
    try:
        push_instants(server.url, 0, 12, hot=False)
        # n3 joins ten seconds behind the others: well within the lateness allowance, judged.
        push(server.url, body("n3", T0 + 2))
        push(server.url, body("n3", T0 + 3))
        deadline = time.monotonic() + 10
        while not named() and time.monotonic() < deadline:
            # An agent that lost an acknowledgement sends an instant again: stored once, judged once.
            push(server.url, body("n3", T0 + 2, hot_gpu=5))
            time.sleep(0.2)
        time.sleep(0.5)
        push(server.url, body("n3", T0 + 1))  # behind n3's judged instant: counted, not named again within the minute
        time.sleep(0.5)
        metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    finally:
        server.stop()
    assert len(named()) == 1, [r.getMessage() for r in caplog.records]
    late = [line for line in metrics.splitlines() if line.startswith('laggard_detector_late_samples_total{cluster="prod"}')]
    assert late and float(late[0].split()[-1]) >= 2, late


def test_a_backlog_read_in_one_cycle_is_judged_whatever_the_order_of_its_nodes(database_url):
    # A detector that fell behind reads many pushes in one cycle; the batches of a node that
    # come first in the log must not make the others' samples "late" (beyond lateness_s).
    from sqlalchemy import create_engine, text

    from server.detect.service import DetectionService

    cfg = DetectionSettings(lateness_s=20, open_after_s=0, clear_after_s=0)
    server = start_in_thread(create_app(Settings(database_url=database_url, detection_enabled=False, detection=cfg)))
    try:
        for node in ("n1", "n2"):  # node by node: all of n1's minute, then all of n2's
            for k in range(0, 60, 10):
                samples = [body(node, T0 + k + i, hot_gpu=3 if node == "n2" and k + i >= 30 else None)["samples"][0] for i in range(10)]
                push(server.url, {**body(node, T0 + k), "samples": samples})
    finally:
        server.stop()
    engine = create_engine(database_url)
    try:
        service = DetectionService(engine, cfg)
        service.run_once()
        assert [shard.detector.late_samples for shard in service.shards.values()] == [0]
        with engine.connect() as conn:
            found = conn.execute(text("SELECT node, gpu, cause, onset FROM episodes")).all()
        assert [(n, g, c, o) for n, g, c, o in found] == [("n2", 3, "thermal", T0 + 30)]
    finally:
        engine.dispose()


def test_a_batch_wholly_behind_the_lateness_allowance_is_counted_but_never_read(database_url, monkeypatch):
    # A spool replayed hours late, or a hostile agent pushing old 64,000-sample batches: the
    # detector would drop every instant as late, so it must not read their rows back at all.
    from sqlalchemy import create_engine

    from server.detect import source
    from server.detect.service import DetectionService

    read: list[str] = []
    real = source.load_instants
    monkeypatch.setattr(source, "load_instants", lambda conn, entries: read.extend(e["node"] for e in entries) or real(conn, entries))
    cfg = DetectionSettings(lateness_s=20)
    server = start_in_thread(create_app(Settings(database_url=database_url, detection_enabled=False, detection=cfg)))
    engine = create_engine(database_url)
    try:
        push_instants(server.url, 600, 606, hot=False)
        service = DetectionService(engine, cfg)
        service.run_once()
        assert sorted(set(read)) == ["n1", "n2"]
        read.clear()
        old = [body("n3", T0 + i)["samples"][0] for i in range(5)]  # n3 new, ten minutes behind
        push(server.url, {**body("n3", T0), "samples": old})
        push(server.url, body("n1", T0 + 601))  # n1 resends an instant already judged
        push_instants(server.url, 606, 607, hot=False)
        service.run_once()
        assert read == ["n1", "n2"]  # the new instant of each; nothing of n3, nor n1's resend
        assert [shard.detector.late_samples for shard in service.shards.values()] == [6]
    finally:
        server.stop()
        engine.dispose()
