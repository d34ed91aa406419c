"""Hints from storage, and a short-lived cache in front of them so schedulers get an answer in
milliseconds however often they ask (kube-scheduler calls the extender for every pod)."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, select

from server.hints.compute import KnownNode, compute_hints
from server.hints.held import as_ack
from server.hints.inventory import Inventory, InventoryCache, qmark, read_inventory
from server.hints.remedy import Ack, GpuFacts, covering_ack, remedy_for
from server.hints.render import by_node_name
from server.hints.settings import HintSettings
from server.store import acks as ack_store
from server.store import episodes, schema
from server.store.driver_rows import driver_rows

log = logging.getLogger(__name__)
NodeT, GpuT, SampleT = schema.Node.__table__, schema.Gpu.__table__, schema.GpuSample.__table__
_FAR_FUTURE = 1e300


def load_hints(conn: Connection, cfg: HintSettings, *, cluster: str | None = None, generated_at: float | None = None,
               inventory: Inventory | None = None) -> dict[str, Any]:
    """Compute the hints document from what is stored: nodes and their GPUs (the inventory, read
    here unless given), each cluster's newest sample time (its "now"), the episodes open or
    recently resolved, and for the hardware faults that wait for a remedy the facts that may
    show it and the acks."""
    inventory = read_inventory(conn, cluster) if inventory is None else inventory
    where, params = ("", ()) if cluster is None else (" WHERE cluster = ?", (cluster,))
    clocks = dict(driver_rows(conn, qmark(conn, f"SELECT cluster, max(last_seen) FROM nodes{where} GROUP BY cluster"), params))
    horizon = min(clocks.values(), default=0.0) - cfg.cooldown_s - cfg.history_s
    eps = episodes.episodes_between(conn, since=horizon, until=_FAR_FUTURE, cluster=cluster)
    eps += _held_before(conn, cfg, horizon, cluster)
    acks = [as_ack(r) for r in ack_store.list_acks(conn, cluster=cluster)] if cfg.hold_until_remedy else []
    facts = _remedy_facts(conn, eps, acks, inventory.nodes, cfg) if cfg.hold_until_remedy else {}
    return compute_hints(eps, inventory.nodes, clocks, cfg, generated_at=time.time() if generated_at is None else generated_at,
                         facts=facts, acks=acks, ok_entries=inventory.ok_entries)


def _agent_text(conn: Connection, cluster: str, node: str) -> str | None:
    """The node's stored agent object as JSON text (None if it has none)."""
    rows = driver_rows(conn, qmark(conn, "SELECT CAST(agent AS TEXT) FROM nodes WHERE cluster = ? AND name = ?"), (cluster, node))
    return rows[0][0] if rows else None


def _boot_time(agent_text: str | None) -> float | None:
    """The node's boot time from its stored agent object (JSON text), None where it has none."""
    agent = json.loads(agent_text) if agent_text else None
    value = agent.get("boot_time") if isinstance(agent, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _held_before(conn: Connection, cfg: HintSettings, horizon: float, cluster: str | None) -> list[dict[str, Any]]:
    """Hardware-fault episodes resolved before the history horizon that may still hold a hint:
    a fault waiting for its remedy is not forgotten because it is old."""
    if not cfg.hold_until_remedy:
        return []
    old = episodes.resolved_before(conn, before=horizon, causes=("xid", "ecc"), cluster=cluster)
    return [e for e in old if remedy_for(e, cfg.remedy_table()) is not None]


def _remedy_facts(conn: Connection, eps: list[dict[str, Any]], acks: list[Ack], nodes: list[KnownNode],
                  cfg: HintSettings) -> dict[tuple[str, str, int], GpuFacts]:
    """GpuFacts of the GPUs with a resolved fault that waits for a remedy nobody acknowledged;
    for those whose node booted since, one newest-sample lookup each (the (gpu_id, ts) key)."""
    facts: dict[tuple[str, str, int], GpuFacts] = {}
    agents: dict[tuple[str, str], str | None] = {}  # read for the few nodes that need it
    slots: dict[tuple[str, str, int], str | None] | None = None  # (cluster, node, index) → uuid, made if needed
    remedies = cfg.remedy_table()
    for ep in eps:
        key = (ep["cluster"], ep["node"], ep.get("gpu"))
        if key[2] is None or key in facts or ep.get("resolved_at") is None or remedy_for(ep, remedies) is None:
            continue
        if covering_ack(ep, acks) is not None:
            continue
        if key[:2] not in agents:
            agents[key[:2]] = _agent_text(conn, *key[:2])  # type: ignore[arg-type]
        boot_time = _boot_time(agents[key[:2]])
        # Samples matter only once the node booted after the fault: until then no lookup.
        rebooted = boot_time is not None and boot_time > float(ep["onset"])
        last = _newest_sample(conn, ep["cluster"], ep["node"], ep.get("uuid")) if rebooted else None
        if slots is None:
            slots = {(n.cluster, n.name, i): u for n in nodes for i, u in n.gpus}
        facts[key] = GpuFacts(uuid=slots.get(key), boot_time=boot_time, last_ts=last[0] if last else None,
                              last_lost=last[1] if last else None, last_remap_pending=last[2] if last else None)
    return facts


def _newest_sample(conn: Connection, cluster: str, node: str, uuid: str | None):
    if uuid is None:
        return None
    gpu_ids = select(GpuT.c.id).join(NodeT, NodeT.c.id == GpuT.c.node_id).where(
        NodeT.c.cluster == cluster, NodeT.c.name == node, GpuT.c.uuid == uuid)
    stmt = (select(SampleT.c.ts, SampleT.c.lost, SampleT.c.remapped_rows_pending).where(SampleT.c.gpu_id.in_(gpu_ids))
            .order_by(SampleT.c.ts.desc()).limit(1))
    return conn.execute(stmt).first()


@dataclass
class Snapshot:
    doc: dict[str, Any]
    at: float  # monotonic time it was computed
    _by_name: dict[str, dict[str, Any]] | None = field(default=None, repr=False)
    _memo: dict[Any, Any] = field(default_factory=dict, repr=False)
    _makers: dict[Any, Callable[["Snapshot"], Any]] = field(default_factory=dict, repr=False)

    def memo(self, key: Any, make: Callable[["Snapshot"], Any]) -> Any:
        """make(self), once per snapshot and key: what a request derives from the document (its
        JSON, gzipped) is the same until the next snapshot. A refresh ahead of the TTL makes
        the keys asked of this snapshot for the next one too (HintsCache._refresh)."""
        if key not in self._memo:
            self._memo[key] = make(self)
            self._makers[key] = make
        return self._memo[key]

    def by_name(self) -> dict[str, dict[str, Any]]:
        """Node name → {action, capacity, cause, text} (render.by_node_name), built once per snapshot."""
        if self._by_name is None:
            self._by_name = by_node_name(self.doc)
        return self._by_name


class HintsCache:
    """Hints per cluster (None: all), computed at most every cache_ttl_s and by one request at a
    time per cluster. A request that finds the cache expired computes it, unless another
    request already is: then it is served the previous snapshot at once, if that is younger
    than max_stale_s, rather than queue behind the database. A failed computation (database
    down) also falls back to a snapshot younger than max_stale_s."""

    def __init__(self, engine: Engine, cfg: HintSettings, *, clock: Callable[[], float] = time.monotonic):
        self.engine = engine
        self.cfg = cfg
        self.clock = clock
        self._entries: dict[str | None, Snapshot] = {}
        self._locks: dict[str | None, threading.Lock] = {}
        self._guard = threading.Lock()
        self.inventories = InventoryCache(clock=clock)
        self.computations = 0

    def peek(self, cluster: str | None = None) -> Snapshot | None:
        """The cached snapshot if it is fresh (no waiting), else None. A fresh one near the end of
        its TTL is recomputed meanwhile on a thread of its own (refresh_ahead_s)."""
        entry = self._entries.get(cluster)
        if entry is None:
            return None
        age = self.clock() - entry.at
        if age > self.cfg.cache_ttl_s:
            return None
        if self.cfg.refresh_ahead_s > 0 and age >= self.cfg.cache_ttl_s - self.cfg.refresh_ahead_s:
            self._refresh_ahead(cluster)
        return entry

    def get(self, cluster: str | None = None) -> Snapshot:
        fresh = self.peek(cluster)
        if fresh is not None:
            return fresh
        lock = self._lock(cluster)
        if not lock.acquire(blocking=False):
            stale = self._usable_stale(cluster)
            if stale is not None:
                return stale
            lock.acquire()
        try:
            fresh = self.peek(cluster)  # computed by the request this one waited for
            if fresh is not None:
                return fresh
            try:
                return self._refresh(cluster)
            except Exception:
                stale = self._usable_stale(cluster)
                if stale is None:
                    raise
                log.exception("hints refresh failed; serving hints %.0f s old", self.clock() - stale.at)
                return stale
        finally:
            lock.release()

    def invalidate(self) -> None:
        self._entries.clear()

    def _usable_stale(self, cluster: str | None) -> Snapshot | None:
        entry = self._entries.get(cluster)
        return entry if entry is not None and self.clock() - entry.at <= self.cfg.max_stale_s else None

    def _refresh_ahead(self, cluster: str | None) -> None:
        """Recompute on a thread unless a computation of this cluster already runs. The snapshot
        served meanwhile is still within its TTL, so nothing is served older than without this."""
        lock = self._lock(cluster)
        if not lock.acquire(blocking=False):
            return

        def refresh() -> None:
            try:
                self._refresh(cluster, derive_like=self._entries.get(cluster))
            except Exception:  # the next request past the TTL computes (or falls back) itself
                log.warning("hints refresh ahead of the TTL failed", exc_info=True)
            finally:
                lock.release()

        threading.Thread(target=refresh, name="hints-refresh", daemon=True).start()

    def _lock(self, cluster: str | None) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(cluster, threading.Lock())

    def _refresh(self, cluster: str | None, *, derive_like: Snapshot | None = None) -> Snapshot:
        """A new snapshot, published once made. derive_like: what requests derived from that
        snapshot (the whole document's JSON and its gzip: 7.8 MB and 0.55 MB at 100,000 GPUs) is
        made for the new one before it is served, so no request waits to make it."""
        with self.engine.connect() as conn:
            doc = load_hints(conn, self.cfg, cluster=cluster, inventory=self.inventories.get(conn, cluster))
        snapshot = Snapshot(doc, self.clock())
        for key, make in list(derive_like._makers.items()) if derive_like is not None else ():
            snapshot.memo(key, make)
        self._entries[cluster] = snapshot
        self.computations += 1
        return snapshot
