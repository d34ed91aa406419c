"""What makes hints fast at 100,000 GPUs (bench/hints.py) changes no answer: a node without
episodes is entered as the general computation would enter it (acks or not), the cache's refresh
ahead of its TTL never serves a snapshot older than the TTL and shows an episode change within
it, and the JSON kept per snapshot, and the extender's answers, follow each new snapshot."""

from __future__ import annotations

import time

import httpx
import orjson

from server.hints.compute import KnownNode, _node_entry, _ok_node, compute_hints
from server.hints.remedy import Ack
from server.hints.service import HintsCache, load_hints
from server.hints.settings import HintSettings
from tests.hints.helpers import T0, collector, get_hints, node_of, open_episode, push_fleet, resolve, settings_for


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_node_without_episodes_is_entered_as_the_general_path_enters_it():
    cfg = HintSettings()
    gpus = {0: "GPU-a-0", 1: None, 3: "GPU-a-3"}
    ack = Ack(cluster="prod", node="a", gpu=0, sample_time=T0, acked_at=T0, acked_by="op")
    for acks in ((), (ack,)):
        general = _node_entry("prod", "a", gpus, {}, now=T0, cfg=cfg, table=cfg.action_table(), facts={}, acks=acks)
        assert _ok_node("prod", "a", gpus) == general


def test_compute_hints_skips_nothing_that_has_an_episode():
    cfg = HintSettings()
    ep = {"id": 7, "cluster": "prod", "node": "b", "gpu": 2, "uuid": "GPU-b-2", "cause": "xid", "severity": "critical",
          "onset": T0, "detected_at": T0, "resolved_at": None, "summary": "xid 79", "evidence": {}}
    nodes = [KnownNode("prod", "a", ((0, "GPU-a-0"),)), KnownNode("prod", "b", ((2, "GPU-b-2"),))]
    doc = compute_hints([ep], nodes, {"prod": T0 + 5}, cfg, generated_at=T0)
    assert [n["action"] for n in doc["nodes"]] == ["ok", "drain"]


def test_cache_refreshes_ahead_of_the_ttl_and_never_serves_older(sqlite_url):
    with collector(settings_for(sqlite_url)) as (server, engine):
        push_fleet(server.url, ["a", "b"], 0, 1)
        clock = Clock()
        cache = HintsCache(engine, HintSettings(cache_ttl_s=2.0, max_stale_s=30.0, refresh_ahead_s=1.0), clock=clock)
        first = cache.get(None)
        clock.now += 0.5
        assert cache.peek(None) is first and cache.computations == 1  # young: no refresh
        open_episode(engine, node="a", gpu=0, cause="xid", severity="critical", onset=T0)
        clock.now += 1.0  # within the TTL, in its last refresh_ahead_s
        assert cache.peek(None) is first  # still served, a refresh runs meanwhile
        deadline = time.monotonic() + 10
        while cache.computations < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        second = cache.peek(None)
        assert second is not first and node_of(second.doc, "a")["action"] == "drain"
        clock.now += 2.5  # past the TTL of both: computed before answering, as without refresh ahead
        assert cache.peek(None) is None and cache.get(None).at == clock.now


def test_answers_follow_episode_changes_through_the_cache(database_url):
    settings = settings_for(database_url, cache_ttl_s=0.3, max_stale_s=0.3, refresh_ahead_s=0.2)
    with collector(settings) as (server, engine):
        push_fleet(server.url, ["a", "b", "c"], 0, 2)
        names = ["a", "b", "c"]

        def answers() -> tuple[dict, dict, dict]:
            doc = get_hints(server.url)
            problems = get_hints(server.url, problems_only="true")
            r = httpx.post(f"{server.url}/scheduler/filter", json={"Pod": {}, "NodeNames": names}, timeout=30)
            assert r.status_code == 200, r.text
            return doc, problems, r.json()

        def settle(predicate, timeout: float = 10.0) -> tuple[dict, dict, dict]:
            deadline = time.monotonic() + timeout
            while True:
                got = answers()
                if predicate(*got) or time.monotonic() > deadline:
                    return got
                time.sleep(0.05)

        doc, problems, filtered = answers()
        assert problems["nodes"] == [] and filtered["NodeNames"] == names
        ep = open_episode(engine, node="b", gpu=1, cause="xid", severity="critical", onset=T0)
        # Three requests may meet two snapshots: wait until each has seen the episode.
        doc, problems, filtered = settle(lambda d, p, f: "b" in f["FailedAndUnresolvableNodes"] and p["nodes"]
                                         and node_of(d, "b")["action"] == "drain")
        assert [n["node"] for n in problems["nodes"]] == ["b"] and node_of(doc, "b")["action"] == "drain"
        assert filtered["NodeNames"] == ["a", "c"]
        # The cached JSON is the document computed now, from what is stored (generated_at aside).
        with engine.connect() as conn:
            direct = orjson.loads(orjson.dumps(load_hints(conn, settings.hints)))
        assert {**doc, "generated_at": 0} == {**direct, "generated_at": 0}
        resolve(engine, ep, T0 + 1)  # and the cool-down is long past: the hint clears
        push_fleet(server.url, ["a", "b", "c"], 3600, 3601)
        doc, problems, filtered = settle(lambda d, p, f: f["NodeNames"] == names and not p["nodes"]
                                         and node_of(d, "b")["action"] == "ok")
        assert problems["nodes"] == [] and node_of(doc, "b")["action"] == "ok"
        assert filtered["FailedAndUnresolvableNodes"] == {}


def test_a_refresh_ahead_makes_what_requests_derived_from_the_last_snapshot(sqlite_url):
    """The whole document's JSON and its gzip (7.8 MB and 0.55 MB at 100,000 GPUs) are made on the
    refresh thread for the next snapshot, before it is served, not by the request that meets it."""
    with collector(settings_for(sqlite_url)) as (server, engine):
        push_fleet(server.url, ["a", "b"], 0, 1)
        clock = Clock()
        cache = HintsCache(engine, HintSettings(cache_ttl_s=2.0, max_stale_s=30.0, refresh_ahead_s=1.0), clock=clock)
        first = cache.get(None)
        made = []

        def names(snap):
            made.append(snap)
            return [n["node"] for n in snap.doc["nodes"]]

        assert first.memo("names", names) == ["a", "b"]
        open_episode(engine, node="a", gpu=0, cause="xid", severity="critical", onset=T0)
        clock.now += 1.5  # in the last refresh_ahead_s of the TTL: refreshed on a thread
        cache.peek(None)
        deadline = time.monotonic() + 10
        while cache.computations < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        second = cache.peek(None)
        assert second is not first and made == [first, second]  # made for the new one before any request
        assert second.memo("names", names) == ["a", "b"] and made == [first, second]
