"""The detector as a background service: follow the ingest log, judge, store episode changes.

Runs in a thread of the collector. On SQLite the leader (LeaderLock) judges every cluster; on
PostgreSQL each replica judges the clusters whose lease it holds (server/detect/leases.py), one
Shard each (server/detect/shard.py). Each cycle's episode changes and read position of a
cluster are committed in one transaction, fenced by the cluster's claim, so neither a restart
nor a takeover loses or repeats a judgement."""

from __future__ import annotations

import logging
import threading
import time

from sqlalchemy import Engine, select

from server.detect.leader import LeaderLock
from server.detect.leases import ClusterLeases
from server.detect.settings import DetectionSettings
from server.detect.shard import Fenced, Shard
from server.detect.source import read_committed
from server.store import counters, schema
from server.store.detector_state import bucket

log = logging.getLogger(__name__)
LATE_SAMPLES = "laggard_detector_late_samples_total"
LATE_LOG_EVERY_S = 60.0
NodeT = schema.Node.__table__


class DetectionService:
    def __init__(self, engine: Engine, cfg: DetectionSettings, *, poll_s: float = 0.2, leader_retry_s: float = 2.0, replica: str = ""):
        self.engine = engine
        self.cfg = cfg
        self.poll_s = poll_s
        self.leader_retry_s = leader_retry_s
        self.lock = LeaderLock(engine, replica=replica)
        self.leases = ClusterLeases(engine) if engine.dialect.name == "postgresql" else None
        self.shards: dict[str, Shard] = {}
        self.clusters: tuple[str, ...] = ()  # judged here now (read by /readyz from another thread)
        self._known: set[str] = set()
        self._polled_at = float("-inf")
        self._lead_tried_at = float("-inf")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="detector", daemon=True)
        self.cycles = 0
        self.last_cycle_at: float | None = None
        self._late_logged_at: dict[tuple[str, str], float] = {}
        self._late_unlogged: dict[tuple[str, str], tuple[int, float]] = {}

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)
        if self.leases is not None:
            self.leases.release()
        self.lock.release()

    def run_once(self) -> int:
        """One cycle: take or give back clusters, read what was committed, judge, store the changes."""
        self._sync_clusters()
        if not self.shards:
            return 0
        instants = read_committed(self.engine, {cluster: shard.cursor for cluster, shard in self.shards.items()}, keep=self._to_read)
        cycle = []
        for cluster, shard in self.shards.items():
            for item in instants.get(cluster, ()):
                shard.detector.add(item)
            changes = shard.detector.advance()
            late = shard.detector.drain_late()
            rows = shard.progress(shard.detector.drain_judged())
            if changes or late or rows:
                cycle.append((shard, changes, late, rows))
        if cycle and self.leases is not None and not self.leases.alive():
            # The lock session is gone, and every lease with it: judge nothing more here.
            log.warning("detector: lost the lock session; giving up clusters %s", ", ".join(self.clusters))
            self._drop(list(self.shards))
            return 0
        stored = 0
        for shard, changes, late, rows in cycle:
            try:
                with self.engine.begin() as conn:
                    shard.fence(conn)
                    for change in changes:
                        shard.store(conn, change)
                    shard.save(conn, rows)
                    if late:
                        counters.add(conn, _late_by_cluster(late))
            except Fenced as exc:
                log.warning("detector: %s; its judgements of this cycle are dropped", exc)
                self._drop([shard.cluster])
                continue
            except Exception:
                log.exception("detection cycle of cluster %s failed; its state is rebuilt from storage", shard.cluster)
                self._drop([shard.cluster])
                continue
            shard.saved(rows)
            self._log_late(late)
            stored += len(changes)
        self.cycles += 1
        self.last_cycle_at = time.time()
        return stored

    def _to_read(self, cluster: str, entries: list[dict]) -> list[dict]:
        """The entries whose rows the detector may judge; the wholly late ones are counted only."""
        detector = self.shards[cluster].detector
        return [e for e in entries if not detector.drop_if_late(cluster, e["node"], e["min_ts"], e["max_ts"], e["samples"])]

    def _sync_clusters(self) -> None:
        """Clusters come from the nodes table; which of them are judged here, from the leases
        (polled every leader_retry_s, and at once when a cluster appears)."""
        with self.engine.connect() as conn:
            clusters = set(conn.execute(select(NodeT.c.cluster).distinct()).scalars())
        if self.leases is None:
            held = clusters  # SQLite: the leader judges them all
        elif clusters != self._known or time.monotonic() - self._polled_at >= self.leader_retry_s:
            self._polled_at = time.monotonic()
            held = self.leases.poll(clusters)
        else:
            held = {c for c in clusters if bucket(c) in self.leases.buckets}
        self._known = clusters
        gone, new = set(self.shards) - held, sorted(held - set(self.shards))
        self._drop(sorted(gone))
        for cluster in new:
            self.shards[cluster] = Shard.claim(self.engine, cluster, self.cfg)
            self.clusters = tuple(sorted(self.shards))
        if gone or new:
            log.info("detector: judging %s (%d of %d clusters)", ", ".join(self.clusters) or "no cluster", len(self.shards),
                     len(clusters))

    def _drop(self, clusters: list[str]) -> None:
        for cluster in clusters:
            self.shards.pop(cluster, None)
        self.clusters = tuple(sorted(self.shards))

    def _log_late(self, late: dict[tuple[str, str], tuple[int, float]]) -> None:
        # Counted in the metric every time; named in the log once a minute per node (a node
        # replaying its spool is late in every cycle).
        now = time.monotonic()
        for key, (count, behind) in sorted(late.items()):
            pending, worst = self._late_unlogged.get(key, (0, 0.0))
            count, behind = count + pending, max(behind, worst)
            if now - self._late_logged_at.get(key, -LATE_LOG_EVERY_S) < LATE_LOG_EVERY_S:
                self._late_unlogged[key] = (count, behind)
                continue
            self._late_unlogged.pop(key, None)
            self._late_logged_at[key] = now
            log.warning("detector: %d samples of node %s (cluster %s) arrived after their instant was judged, up to %.0f s "
                        "behind it: stored, not judged", count, key[1], key[0], behind)

    def _lead(self) -> bool:
        """Whether this process leads (alert dispatch, shared metrics; on SQLite, detection)."""
        if self.lock.held:
            return self.lock.still_held()
        # A replica that does not lead tries again every leader_retry_s: if the leader dies its
        # lock goes with it and we take over within that.
        if time.monotonic() - self._lead_tried_at >= self.leader_retry_s:
            self._lead_tried_at = time.monotonic()
            return self.lock.try_acquire()
        return False

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                leading = self._lead()
            except Exception:
                log.exception("detector: taking the lead failed; will retry")
                leading = False
            if self.leases is None and not leading:
                self._drop(list(self.shards))
                self._stop.wait(self.leader_retry_s)
                continue
            try:
                self.run_once()
            except Exception:
                log.exception("detection cycle failed; state is rebuilt from storage")
                self._drop(list(self.shards))
                self._stop.wait(self.leader_retry_s)
                continue
            self._stop.wait(self.poll_s)


def _late_by_cluster(late: dict[tuple[str, str], tuple[int, float]]) -> list[tuple[str, dict[str, str], float]]:
    per_cluster: dict[str, int] = {}
    for (cluster, _node), (count, _behind) in late.items():
        per_cluster[cluster] = per_cluster.get(cluster, 0) + count
    return [(LATE_SAMPLES, {"cluster": cluster}, n) for cluster, n in sorted(per_cluster.items())]

