"""The hints' inventory is read again exactly when it may have changed (server/hints/inventory.py):
every way the ingest adds a node or a GPU, or moves a GPU to another node or slot, changes its
stamp on both databases; what the ingest does to a known node at every push does not. And hints
computed from a kept inventory are the hints computed from a fresh read."""

from __future__ import annotations

import pytest
from sqlalchemy import insert, update

from server.hints.inventory import InventoryCache, inventory_stamp, read_inventory
from server.hints.service import load_hints
from server.hints.settings import HintSettings
from server.store import schema
from tests.hints.helpers import open_episode

NodeT, GpuT = schema.Node.__table__, schema.Gpu.__table__
T0 = 1_700_000_000.0


def _node(conn, node_id: int, name: str, cluster: str = "prod") -> None:
    conn.execute(insert(NodeT).values(id=node_id, cluster=cluster, name=name, labels={}, agent=None, first_seen=T0, last_seen=T0))


def _gpu(conn, gpu_id: int, node_id: int, index: int, first_seen: float = T0) -> None:
    conn.execute(insert(GpuT).values(id=gpu_id, uuid=f"GPU-{gpu_id}", node_id=node_id, index=index, model="H100", first_seen=first_seen))


def _move(conn, gpu_id: int, **values) -> None:
    conn.execute(update(GpuT).where(GpuT.c.id == gpu_id).values(**values))


@pytest.fixture
def fleet(migrated_engine):
    """Two nodes of two GPUs each, a third node without GPUs."""
    with migrated_engine.begin() as conn:
        _node(conn, 1, "a")
        _node(conn, 2, "b")
        _node(conn, 3, "c")
        for gpu_id, node_id, index in ((1, 1, 0), (2, 1, 1), (3, 2, 0), (4, 2, 1)):
            _gpu(conn, gpu_id, node_id, index)
    return migrated_engine


CHANGES = {
    "a node registers": lambda c: _node(c, 4, "d"),
    "a GPU registers": lambda c: _gpu(c, 5, 3, 0),
    "a GPU replaces another in its slot": lambda c: _gpu(c, 5, 1, 0, first_seen=T0 + 60),
    "a GPU moves to another node": lambda c: _move(c, 2, node_id=3),
    "a GPU moves to another slot": lambda c: _move(c, 2, index=7),
    "two GPUs trade nodes": lambda c: (_move(c, 2, node_id=2), _move(c, 3, node_id=1)),
    "two GPUs trade slots": lambda c: (_move(c, 1, index=1), _move(c, 2, index=0)),
    "two GPUs trade nodes and slots": lambda c: (_move(c, 1, node_id=2, index=1), _move(c, 4, node_id=1, index=0)),
}


def _slots(inventory) -> dict[tuple[str, str], tuple]:
    return {(n.cluster, n.name): n.gpus for n in inventory.nodes}


@pytest.mark.parametrize("change", CHANGES, ids=list(CHANGES))
def test_every_inventory_change_reads_the_inventory_again(fleet, change):
    cache = InventoryCache()
    with fleet.connect() as conn:
        before = cache.get(conn)
        stamp = inventory_stamp(conn)
    with fleet.begin() as conn:
        CHANGES[change](conn)
    with fleet.connect() as conn:
        assert inventory_stamp(conn) != stamp
        after = cache.get(conn)
        fresh = read_inventory(conn)
    assert after is not before and cache.reads == 2
    assert _slots(after) == _slots(fresh) != _slots(before)


def test_what_every_push_does_to_a_known_node_reads_nothing_again(fleet):
    cache = InventoryCache()
    with fleet.connect() as conn:
        before = cache.get(conn)
    with fleet.begin() as conn:
        conn.execute(update(NodeT).where(NodeT.c.id == 1).values(last_seen=T0 + 5, labels={"job": "x"}, agent={"boot_time": T0}))
        _move(conn, 1, model="NVIDIA H100 80GB HBM3", pci_bus_id="00000000:18:00.0")  # learnt later: not listed
    with fleet.connect() as conn:
        assert cache.get(conn) is before and cache.reads == 1


def test_an_inventory_is_read_again_once_it_is_max_age_old_whatever_its_stamp(fleet):
    now = [0.0]
    cache = InventoryCache(max_age_s=60, clock=lambda: now[0])
    with fleet.connect() as conn:
        first = cache.get(conn)
        now[0] = 60.0
        assert cache.get(conn) is first
        now[0] = 60.5
        assert cache.get(conn) is not first and cache.reads == 2


def test_a_cluster_s_inventory_lists_that_cluster_only(fleet):
    with fleet.begin() as conn:
        _node(conn, 9, "a", cluster="dev")
        _gpu(conn, 9, 9, 0)
    with fleet.connect() as conn:
        dev = read_inventory(conn, "dev")
        assert _slots(dev) == {("dev", "a"): ((0, "GPU-9"),)}
        stamp = inventory_stamp(conn, "dev")
    with fleet.begin() as conn:
        _gpu(conn, 10, 1, 2)  # prod's
    with fleet.connect() as conn:
        assert inventory_stamp(conn, "dev") == stamp


def test_hints_from_a_kept_inventory_are_the_hints_from_a_fresh_read(fleet):
    cfg = HintSettings()
    cache = InventoryCache()
    open_episode(fleet, node="b", gpu=0, cause="thermal", severity="critical", onset=T0)
    open_episode(fleet, node="c", gpu=None, cause="network", severity="warning", onset=T0)
    seen = []
    for step in range(3):
        with fleet.connect() as conn:
            kept = load_hints(conn, cfg, generated_at=T0, inventory=cache.get(conn))
            fresh = load_hints(conn, cfg, generated_at=T0)
        assert kept == fresh
        seen.append(kept)
        with fleet.begin() as conn:  # then a GPU moves to the node with a node-level episode, then a node comes
            _move(conn, 2, node_id=3) if step == 0 else _node(conn, 10 + step, f"n{step}")
    assert cache.reads == 3
    assert [len(doc["nodes"]) for doc in seen] == [3, 3, 4]
    assert [len(n["gpus"]) for n in seen[1]["nodes"]] == [1, 2, 1]  # a, b, c: GPU 2 on c
    assert [n["action"] != "ok" for n in seen[2]["nodes"]] == [False, True, True, False]
