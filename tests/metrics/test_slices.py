"""GET /metrics?cluster=…&shard=i&shards=n (server/metrics/selection.py): the slices of one split,
scraped together, carry every series of the whole scrape exactly once, with the same values (the
peer deviation included, whose median spans a peer group), on both databases; a bad selection is
a 400 naming the parameter."""

from __future__ import annotations

import time

import httpx
import pytest

from server.app import create_app
from server.metrics.selection import Selection, SelectionError, parse_selection
from server.serve import start_in_thread
from tests.metrics.fleet import push_range
from tests.metrics.test_collector import settings_for, wait_metric
from tests.metrics.tools import samples

# Whose values move between two scrapes a moment apart (wall-clock ages, this process's own).
MOVING = ("laggard_detection_lag_seconds", "laggard_alert_oldest_pending_age_seconds", "process_", "python_")


@pytest.fixture
def two_cluster_server(database_url):
    """Two clusters: prod (n1..n3, n2's GPU 3 hot from instant 5) and dev (d1, d2, d1's GPU 2
    reports XID 79), 12 instants each, detection done before any slice is scraped."""
    url = database_url
    t0 = float(int(time.time()) - 30)
    server = start_in_thread(create_app(settings_for(url)))
    try:
        push_range(server.url, t0, 0, 5, nodes=("n1", "n2", "n3"))
        push_range(server.url, t0, 5, 12, nodes=("n1", "n2", "n3"), hot={"n2": (3,)})
        push_range(server.url, t0, 0, 12, nodes=("d1", "d2"), cluster="dev", xid={"d1": 2})
        wait_metric(server.url, "laggard_straggler_active", node="n2")
        wait_metric(server.url, "laggard_ingest_samples_total", cluster="dev")
        time.sleep(0.5)  # the ingest counters' flush (flush_interval_s 0.2)
        yield server.url
    finally:
        server.stop()


def scrape(url: str, query: str = "") -> dict[tuple[str, frozenset], float]:
    r = httpx.get(f"{url}/metrics{query}", timeout=30)
    assert r.status_code == 200, r.text
    return samples(r.text)


def assert_union_is_whole(url: str, queries: list[str]) -> None:
    whole = scrape(url)
    slices = [scrape(url, q) for q in queries]
    union: dict[tuple[str, frozenset], float] = {}
    for part in slices:
        assert not union.keys() & part.keys(), "a series is in two slices"
        union.update(part)
    assert union.keys() == whole.keys()
    for key, value in whole.items():
        if not key[0].startswith(MOVING):
            assert union[key] == pytest.approx(value), key


def test_union_of_the_slices_is_the_whole_scrape(two_cluster_server):
    url = two_cluster_server
    assert_union_is_whole(url, ["?cluster=prod", "?cluster=dev", "?cluster="])
    for shards in (2, 3, 5):
        assert_union_is_whole(url, [f"?shard={i}&shards={shards}" for i in range(shards)])
    # Shards within a cluster, and a repeated cluster.
    assert_union_is_whole(url, [f"?cluster=prod&shard={i}&shards=2" for i in range(2)] + ["?cluster=dev&cluster="])
    # Each slice carries what it says.
    prod = scrape(url, "?cluster=prod")
    assert {dict(labels).get("cluster") for _, labels in prod} == {"prod"}
    assert any(name == "laggard_gpu_peer_deviation_ratio" for name, _ in prod)
    unclustered = scrape(url, "?cluster=")
    names = {name for name, _ in unclustered}
    assert {"laggard_build_info", "laggard_fleet_exporter", "laggard_detection_backlog_batches"} <= names
    assert all("cluster" not in dict(labels) for _, labels in unclustered)
    assert scrape(url, "?cluster=nowhere") == {}


@pytest.mark.parametrize(("query", "parameter"), [
    ("?shard=3&shards=3", "shard"), ("?shard=-1&shards=3", "shard"), ("?shard=x&shards=2", "shard"),
    ("?shard=0&shards=0", "shards"), ("?shard=0&shards=99999", "shards"), ("?shard=0", "shards"), ("?shards=2", "shard"),
    ("?shard=0&shard=1&shards=2", "shard"), ("?clusters=prod", "clusters"),
])
def test_a_bad_selection_is_a_400_naming_the_parameter(sqlite_url, query, parameter):
    server = start_in_thread(create_app(settings_for(sqlite_url)))
    try:
        r = httpx.get(f"{server.url}/metrics{query}", timeout=30)
    finally:
        server.stop()
    assert r.status_code == 400
    assert r.headers["content-type"].startswith("application/json")
    [detail] = r.json()["detail"]
    assert detail["loc"] == ["query", parameter]
    assert parameter in detail["msg"]


def test_parse_selection():
    assert parse_selection([]) == Selection()
    assert parse_selection([]).whole
    sel = parse_selection([("cluster", "a"), ("cluster", ""), ("shard", "1"), ("shards", "4")])
    assert sel == Selection(frozenset({"a", ""}), 1, 4)
    assert not sel.takes_unclustered  # shard 1
    assert Selection(frozenset({""})).takes_unclustered
    assert not Selection(frozenset({"a"})).takes_unclustered
    with pytest.raises(SelectionError):
        parse_selection([("shard", "٣"), ("shards", "4")])  # a digit, but not an ASCII one
