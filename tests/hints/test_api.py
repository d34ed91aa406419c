"""GET /api/v1/hints and /api/v1/hints/slurm over real HTTP on SQLite and PostgreSQL: episodes
the real detector opens become hints, which clear only once the episode resolved and the
cool-down passed in the cluster's sample time; flapping keeps one hint; filters; the Slurm
text; `laggard hints`; the cache."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from server.cli.main import main as laggard
from server.hints.service import HintsCache
from server.hints.settings import HintSettings
from server.store.engine import make_engine
from tests.hints.helpers import HOT, T0, collector, get_hints, node_of, open_episode, push_fleet, resolve, settings_for

NODE_KEYS = ["node", "cluster", "action", "capacity", "since", "reasons", "gpus"]
GPU_KEYS = ["index", "uuid", "action", "capacity"]


def wait_for(fetch, predicate, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while True:
        got = fetch()
        if predicate(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def test_detected_straggler_becomes_a_hint_and_clears_after_the_cool_down(database_url):
    settings = settings_for(database_url, detect=True, cooldown_s=5.0)
    with collector(settings) as (server, _):
        url = server.url
        push_fleet(url, ["n1", "n2"], 0, 5)
        push_fleet(url, ["n1", "n2"], 5, 9, faults={"n2": {3: HOT}})
        doc = wait_for(lambda: get_hints(url), lambda d: node_of(d, "n2")["action"] != "ok")

        assert list(doc) == ["generated_at", "sample_time", "nodes"]
        assert doc["sample_time"] == {"prod": T0 + 8}
        n1, n2 = node_of(doc, "n1"), node_of(doc, "n2")
        assert list(n2) == NODE_KEYS and list(n2["gpus"][0]) == GPU_KEYS
        assert (n1["action"], n1["capacity"], n1["since"], n1["reasons"]) == ("ok", 1.0, None, [])
        # HW thermal slowdown: thermal/critical → avoid; 1400 MHz against peers at ~1976 MHz.
        assert (n2["action"], n2["since"]) == ("avoid", T0 + 5)
        assert n2["capacity"] == pytest.approx(1400 / 1976, abs=0.003)
        assert [(g["index"], g["uuid"], g["action"]) for g in n2["gpus"] if g["action"] != "ok"] == [(3, "GPU-n2-3", "avoid")]
        reason = n2["reasons"][0]
        assert (reason["gpu"], reason["cause"], reason["severity"], reason["action"], reason["resolved_at"]) == (
            3, "thermal", "critical", "avoid", None)
        assert "1400" in reason["summary"]
        assert httpx.get(f"{url}/api/v1/hints/slurm").text == f"n2 avoid thermal: {reason['summary']}\n"

        # Healthy again: the episode resolves at T0+9 (first clean sample) ...
        push_fleet(url, ["n1", "n2"], 9, 14)
        stragglers = wait_for(lambda: httpx.get(f"{url}/api/v1/stragglers").json()["stragglers"], lambda s: s == [])
        assert stragglers == []
        # ... but with the newest sample at T0+13 the 5 s cool-down (until T0+14) still holds the hint.
        n2 = node_of(get_hints(url), "n2")
        assert (n2["action"], n2["since"]) == ("avoid", T0 + 5)
        assert (n2["reasons"][0]["resolved_at"], n2["reasons"][0]["clears_at"]) == (T0 + 9, T0 + 14)
        time.sleep(0.3)  # wall time does not clear it: only sample time does
        assert node_of(get_hints(url), "n2")["action"] == "avoid"

        push_fleet(url, ["n1", "n2"], 14, 15)  # sample time reaches T0+14
        n2 = node_of(get_hints(url), "n2")
        assert (n2["action"], n2["capacity"], n2["since"], n2["reasons"]) == ("ok", 1.0, None, [])
        assert httpx.get(f"{url}/api/v1/hints/slurm").text == ""


@pytest.fixture
def stored(database_url):
    """A collector without its detector: the test writes the episodes."""
    with collector(settings_for(database_url, cooldown_s=60.0)) as (server, engine):
        push_fleet(server.url, ["a", "b", "c"], 0, 1)
        push_fleet(server.url, ["a"], 0, 1, cluster="lab")
        yield server, engine


def test_a_flapping_gpu_keeps_one_hint(stored):
    server, engine = stored
    first = open_episode(engine, node="a", gpu=2, cause="thermal", severity="warning", onset=T0 - 300, evidence={"clock_deviation": -0.12})
    resolve(engine, first, T0 - 200)
    a = node_of(get_hints(server.url), "a", "prod")
    assert a["action"] == "ok"  # resolved 200 s ago, cool-down 60 s: clear

    resolve(engine, first, T0 - 30)  # had it resolved 30 s ago, it would still hold
    a = node_of(get_hints(server.url), "a", "prod")
    assert (a["action"], a["capacity"], a["since"]) == ("rebalance", 0.88, T0 - 300)

    open_episode(engine, node="a", gpu=2, cause="thermal", severity="critical", onset=T0 - 10, evidence={"clock_deviation": -0.3})
    a = node_of(get_hints(server.url), "a", "prod")
    assert (a["action"], a["capacity"], a["since"]) == ("avoid", 0.7, T0 - 300)  # back within the cool-down: same hint
    assert [(r["severity"], r["resolved_at"]) for r in a["reasons"]] == [("critical", None), ("warning", T0 - 30)]


def test_filters_and_slurm_text(stored):
    server, engine = stored
    open_episode(engine, node="b", gpu=1, cause="xid", severity="critical", onset=T0, summary="GPU 1 hardware XID 79 (GPU has fallen off the bus)")
    open_episode(engine, node="c", gpu=None, cause="network", severity="warning", onset=T0, summary="mlx5_0 port 1 transmit-wait 40x the peer median")
    open_episode(engine, node="c", gpu=4, cause="clock", severity="warning", onset=T0, summary="GPU 4 SM clock -10%")
    open_episode(engine, node="a", gpu=0, cause="ecc", severity="critical", onset=T0, cluster="lab", summary="GPU 0 2 new uncorrected ECC errors")

    every = get_hints(server.url)
    assert [(n["cluster"], n["node"], n["action"]) for n in every["nodes"]] == [
        ("lab", "a", "drain"), ("prod", "a", "ok"), ("prod", "b", "drain"), ("prod", "c", "avoid")]
    assert every["sample_time"] == {"lab": T0, "prod": T0}
    prod = get_hints(server.url, cluster="prod")
    assert [n["node"] for n in prod["nodes"]] == ["a", "b", "c"] and list(prod["sample_time"]) == ["prod"]
    assert [n["node"] for n in get_hints(server.url, cluster="prod", problems_only="true")["nodes"]] == ["b", "c"]
    assert [n["cluster"] for n in get_hints(server.url, node="a")["nodes"]] == ["lab", "prod"]
    c = node_of(prod, "c")
    assert [r["cause"] for r in c["reasons"]] == ["network", "clock"]  # the gravest first
    assert {g["action"] for g in c["gpus"]} == {"avoid"}  # the node's port problem reaches every GPU

    text = httpx.get(f"{server.url}/api/v1/hints/slurm", params={"cluster": "prod"})
    assert text.headers["content-type"].startswith("text/plain")
    assert text.text.splitlines() == [
        "b drain xid: GPU 1 hardware XID 79 (GPU has fallen off the bus)",
        "c avoid network: mlx5_0 port 1 transmit-wait 40x the peer median (+1 more)",
    ]
    assert httpx.get(f"{server.url}/api/v1/hints/slurm").text.splitlines()[0] == "a drain ecc: GPU 0 2 new uncorrected ECC errors"


def test_laggard_hints_command(stored, capsys):
    server, engine = stored
    open_episode(engine, node="b", gpu=1, cause="thermal", severity="warning", onset=T0, evidence={"clock_deviation": -0.15},
                 summary="GPU 1 SW thermal")
    assert laggard(["hints", "--server", server.url, "--cluster", "prod"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["CLUSTER", "NODE", "ACTION", "CAPACITY", "SINCE", "GPUS", "REASON"]
    assert out[1].split()[:4] == ["prod", "b", "rebalance", "0.85"] and "1:rebalance@0.85" in out[1]
    assert out[-1] == "(2 more nodes ok)"
    assert laggard(["hints", "--server", server.url, "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert node_of(doc, "b")["action"] == "rebalance"
    assert laggard(["hints", "--server", "http://127.0.0.1:9"]) == 1
    assert "cannot reach" in capsys.readouterr().err


# --- the cache ---------------------------------------------------------------------------------

class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_cache_serves_fresh_hints_then_recomputes(sqlite_url):
    with collector(settings_for(sqlite_url)) as (server, engine):
        push_fleet(server.url, ["a", "b"], 0, 1)
        clock = Clock()
        # refresh_ahead_s=0: this checks the TTL alone (test_cache_refreshes_ahead_of_the_ttl has the rest).
        cache = HintsCache(engine, HintSettings(cache_ttl_s=2.0, max_stale_s=30.0, refresh_ahead_s=0), clock=clock)
        first = cache.get("prod")
        open_episode(engine, node="a", gpu=0, cause="xid", severity="critical", onset=T0)
        clock.now += 1.9
        assert cache.get("prod") is first and cache.peek("prod") is first  # within the TTL
        clock.now += 0.2
        assert cache.peek("prod") is None
        second = cache.get("prod")
        assert node_of(second.doc, "a")["action"] == "drain" and cache.computations == 2
        assert second.by_name()["a"]["action"] == "drain" and second.by_name()["b"]["action"] == "ok"


def test_cache_computes_once_for_concurrent_requests_and_serves_stale_meanwhile(sqlite_url):
    with collector(settings_for(sqlite_url)) as (server, engine):
        push_fleet(server.url, ["a"], 0, 1)
        clock = Clock()
        cache = HintsCache(engine, HintSettings(cache_ttl_s=1.0, max_stale_s=30.0), clock=clock)
        old = cache.get(None)
        clock.now += 5  # expired, but younger than max_stale_s
        gate, release = threading.Event(), threading.Event()
        real = cache._refresh

        def slow_refresh(cluster):
            gate.set()
            release.wait(5)
            return real(cluster)

        cache._refresh = slow_refresh
        computing = threading.Thread(target=cache.get, args=(None,))
        computing.start()
        assert gate.wait(5)
        assert [cache.get(None) for _ in range(20)] == [old] * 20
        # Still computing: had those calls waited behind the computation, it would be over.
        assert computing.is_alive()
        release.set()
        computing.join(5)
        assert cache.computations == 2 and cache.get(None) is not old


def test_cache_falls_back_to_stale_hints_when_the_database_fails(sqlite_url):
    with collector(settings_for(sqlite_url)) as (server, engine):
        push_fleet(server.url, ["a"], 0, 1)
        clock = Clock()
        broken = make_engine("sqlite:////nonexistent-dir/x.db")
        cache = HintsCache(engine, HintSettings(cache_ttl_s=1.0, max_stale_s=10.0), clock=clock)
        old = cache.get(None)
        cache.engine = broken
        clock.now += 5
        assert cache.get(None) is old
        clock.now += 10  # too old to serve
        with pytest.raises(Exception):
            cache.get(None)
        broken.dispose()
