"""The inventory the hints list (every node and its GPUs), read again only when it changed.

At 100,000 GPUs reading and arranging the inventory was most of a hints computation, and each
computation holds the interpreter for as long as it runs, so requests served meanwhile (the
extender's, one per pod) waited for it. The inventory changes when a node or GPU is registered
and when a GPU moves to another node or slot (server/store/ids.py); its stamp, one aggregate
query the database runs on its own, changes with each of those: the count and highest id of
nodes and GPUs for what is added (no node or GPU row is ever deleted or renamed), and sums of
each GPU's node and slot weighted by its id for what moves (two GPUs trading places change
the weighted sums). The inventory is read again at least every `max_age_s` whatever the stamp.

Nodes without episodes, almost all of a large fleet, are entered in the hints the same way
every time: their entries are made once per inventory (compute.py `ok_entries`), and shared by
the snapshots that follow, which nobody modifies."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection

from server.hints.compute import KnownNode
from server.store.driver_rows import driver_rows

MAX_AGE_S = 60.0


@dataclass
class Inventory:
    stamp: tuple
    nodes: list[KnownNode]
    read_at: float
    ok_entries: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)


def qmark(conn: Connection, sql: str) -> str:
    """`sql` written with qmark parameters, in the connection's driver's own style."""
    return sql.replace("?", "%s") if conn.dialect.name == "postgresql" else sql


def _where(cluster: str | None) -> tuple[str, tuple]:
    return ("", ()) if cluster is None else (" WHERE n.cluster = ?", (cluster,))


def inventory_stamp(conn: Connection, cluster: str | None = None) -> tuple:
    where, params = _where(cluster)
    nodes = driver_rows(conn, qmark(conn, f"SELECT count(*), max(n.id) FROM nodes n{where}"), params)[0]
    # BIGINT: id × node id passes 2^31 in a fleet of 50,000 nodes.
    gpus = driver_rows(conn, qmark(conn, 'SELECT count(*), max(g.id), sum(g.node_id), sum(g."index"), '
                                         'sum(CAST(g.id AS BIGINT) * g.node_id), sum(CAST(g.id AS BIGINT) * g."index") '
                                         f"FROM gpus g JOIN nodes n ON n.id = g.node_id{where}"), params)[0]
    return tuple(nodes) + tuple(gpus)


def read_inventory(conn: Connection, cluster: str | None = None, *, stamp: tuple | None = None,
                   clock: Callable[[], float] = time.monotonic) -> Inventory:
    """The nodes and the GPU that holds each of their slots (a replaced GPU leaves its old row
    behind: the newest one holds the index), read as plain driver rows."""
    stamp = inventory_stamp(conn, cluster) if stamp is None else stamp
    where, params = _where(cluster)
    node_rows = driver_rows(conn, qmark(conn, f"SELECT n.id, n.cluster, n.name FROM nodes n{where}"), params)
    gpu_rows = driver_rows(conn, qmark(conn, f'SELECT g.node_id, g."index", g.uuid, g.first_seen FROM gpus g '
                                             f"JOIN nodes n ON n.id = g.node_id{where}"), params)
    gpus: dict[int, dict[int, tuple[float, str]]] = {}
    for node_id, index, uuid, first_seen in gpu_rows:
        slot = gpus.setdefault(node_id, {})
        if index not in slot or first_seen >= slot[index][0]:
            slot[index] = (first_seen, uuid)
    nodes = [KnownNode(node_cluster, name, tuple((i, u) for i, (_, u) in sorted(gpus.get(node_id, {}).items())))
             for node_id, node_cluster, name in node_rows]
    return Inventory(stamp, nodes, clock())


class InventoryCache:
    """The last inventory read per cluster (None: all), reused while its stamp holds."""

    def __init__(self, *, max_age_s: float = MAX_AGE_S, clock: Callable[[], float] = time.monotonic):
        self.max_age_s = max_age_s
        self.clock = clock
        self._last: dict[str | None, Inventory] = {}
        self.reads = 0

    def get(self, conn: Connection, cluster: str | None = None) -> Inventory:
        stamp = inventory_stamp(conn, cluster)
        last = self._last.get(cluster)
        if last is not None and last.stamp == stamp and self.clock() - last.read_at <= self.max_age_s:
            return last
        inventory = read_inventory(conn, cluster, stamp=stamp, clock=self.clock)
        self._last[cluster] = inventory
        self.reads += 1
        return inventory
