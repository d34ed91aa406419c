"""Hints from storage, and a short-lived cache in front of them so schedulers get an answer in
milliseconds however often they ask (kube-scheduler calls the extender for every pod)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, select

from server.hints.compute import KnownNode, compute_hints
from server.hints.render import by_node_name
from server.hints.settings import HintSettings
from server.store import episodes, schema

log = logging.getLogger(__name__)
NodeT, GpuT = schema.Node.__table__, schema.Gpu.__table__
_FAR_FUTURE = 1e300


def load_hints(conn: Connection, cfg: HintSettings, *, cluster: str | None = None, generated_at: float | None = None) -> dict[str, Any]:
    """Compute the hints document from what is stored: nodes and their GPUs (the inventory),
    each cluster's newest sample time (its "now"), and the episodes open or recently resolved."""
    node_stmt = select(NodeT.c.id, NodeT.c.cluster, NodeT.c.name, NodeT.c.last_seen)
    gpu_stmt = select(GpuT.c.node_id, GpuT.c.index, GpuT.c.uuid, GpuT.c.first_seen).join(NodeT, NodeT.c.id == GpuT.c.node_id)
    if cluster is not None:
        node_stmt = node_stmt.where(NodeT.c.cluster == cluster)
        gpu_stmt = gpu_stmt.where(NodeT.c.cluster == cluster)
    node_rows = conn.execute(node_stmt).all()
    gpus: dict[int, dict[int, tuple[float, str]]] = {}
    for node_id, index, uuid, first_seen in conn.execute(gpu_stmt).all():
        slot = gpus.setdefault(node_id, {})
        # A replaced GPU leaves its old row behind: the newest one holds the index.
        if index not in slot or first_seen >= slot[index][0]:
            slot[index] = (first_seen, uuid)
    clocks: dict[str, float] = {}
    nodes = []
    for node_id, node_cluster, name, last_seen in node_rows:
        clocks[node_cluster] = max(clocks.get(node_cluster, last_seen), last_seen)
        nodes.append(KnownNode(node_cluster, name, tuple((i, u) for i, (_, u) in sorted(gpus.get(node_id, {}).items()))))
    horizon = min(clocks.values(), default=0.0) - cfg.cooldown_s - cfg.history_s
    eps = episodes.episodes_between(conn, since=horizon, until=_FAR_FUTURE, cluster=cluster)
    return compute_hints(eps, nodes, clocks, cfg, generated_at=time.time() if generated_at is None else generated_at)


@dataclass
class Snapshot:
    doc: dict[str, Any]
    at: float  # monotonic time it was computed
    _by_name: dict[str, dict[str, Any]] | None = field(default=None, repr=False)

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
        self.computations = 0

    def peek(self, cluster: str | None = None) -> Snapshot | None:
        """The cached snapshot if it is fresh (no waiting, no thread), else None."""
        entry = self._entries.get(cluster)
        return entry if entry is not None and self.clock() - entry.at <= self.cfg.cache_ttl_s else None

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

    def _lock(self, cluster: str | None) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(cluster, threading.Lock())

    def _refresh(self, cluster: str | None) -> Snapshot:
        with self.engine.connect() as conn:
            doc = load_hints(conn, self.cfg, cluster=cluster)
        snapshot = Snapshot(doc, self.clock())
        self._entries[cluster] = snapshot
        self.computations += 1
        return snapshot
