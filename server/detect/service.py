"""The detector as a background service: follow the ingest log, judge, store episode changes.

Runs in a thread of the collector, in one process per database (LeaderLock). Each cycle's
episode changes and its read position are committed in one transaction, so a restart neither
loses nor repeats a judgement."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import defaultdict

from sqlalchemy import Engine, select

from server.alerts.outbox import record_episode_change
from server.detect.engine import NEVER, Detector, EpisodeChange
from server.detect.leader import LeaderLock
from server.detect.persistence import Escalated, Opened, Resolved
from server.detect.settings import DetectionSettings
from server.detect.source import LogCursor, load_instants
from server.store import counters, episodes, schema
from server.store.dialect import upsert

log = logging.getLogger(__name__)
ProgressT = schema.DetectorProgress.__table__
_CURSOR_KEY = "ingest_log.low_water"
_JUDGED_PREFIX = "judged_until:"  # per cluster: every node still reporting judged up to here (the lag gauge)
_NODE_PREFIX = "judged_node:"  # per node, "<cluster>/<node>" (neither may contain "/"): where its judging resumes
LATE_SAMPLES = "laggard_detector_late_samples_total"
LATE_LOG_EVERY_S = 60.0
LogT, NodeT = schema.IngestLog.__table__, schema.Node.__table__


class DetectionService:
    def __init__(self, engine: Engine, cfg: DetectionSettings, *, poll_s: float = 0.2, leader_retry_s: float = 2.0):
        self.engine = engine
        self.cfg = cfg
        self.poll_s = poll_s
        self.leader_retry_s = leader_retry_s
        self.lock = LeaderLock(engine)
        self.detector: Detector | None = None
        self.cursor: LogCursor | None = None
        self.open_ids: dict[tuple[str, str], int] = {}
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
        self.lock.release()

    def run_once(self) -> int:
        """One cycle: read what was committed, judge what is complete, store the changes."""
        if self.detector is None:
            self._resume()
        with self.engine.connect() as conn:
            entries = self.cursor.take(conn)
            instants = load_instants(conn, entries) if entries else []
        for item in instants:
            self.detector.add(item)
        changes = self.detector.advance()
        late = self.detector.drain_late()
        judged = self.detector.drain_judged()
        with self.engine.begin() as conn:
            for change in changes:
                self._store(conn, change)
            self._save_progress(conn, judged)
            if late:
                counters.add(conn, _late_by_cluster(late))
        self._log_late(late)
        self.cycles += 1
        self.last_cycle_at = time.time()
        return len(changes)

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

    def _save_progress(self, conn, judged: dict[tuple[str, str], float]) -> None:
        progress = {_CURSOR_KEY: float(self.cursor.low_water)}
        progress.update({f"{_JUDGED_PREFIX}{cluster}": ts for cluster, ts in self.detector.judged_until().items()})
        progress.update({f"{_NODE_PREFIX}{cluster}/{node}": ts for (cluster, node), ts in judged.items()})
        for key, value in progress.items():
            conn.execute(upsert(conn.dialect.name, ProgressT, {"key": key, "value": value}, key="key"))

    def _resume(self) -> None:
        """Pick up where the last leader stopped: its read position, what it had judged, the
        windows it had built (replayed from storage) and the episodes it left open."""
        self.detector = Detector(self.cfg)
        self.cursor = LogCursor()
        with self.engine.connect() as conn:
            progress = dict(conn.execute(select(ProgressT.c.key, ProgressT.c.value)).all())
            self.cursor.low_water = int(progress.pop(_CURSOR_KEY, 0))
            judged = {k.removeprefix(_JUDGED_PREFIX): v for k, v in progress.items() if k.startswith(_JUDGED_PREFIX)}
            per_node: dict[str, dict[str, float]] = defaultdict(dict)
            for key, until in progress.items():
                if key.startswith(_NODE_PREFIX):
                    cluster, node = key.removeprefix(_NODE_PREFIX).split("/", 1)
                    per_node[cluster][node] = until
            for cluster in judged.keys() | per_node.keys():
                self._replay(conn, cluster, judged.get(cluster), per_node.get(cluster, {}))
            for ep in episodes.active_for_detector(conn):
                self.open_ids[(ep["entity"], ep["cause"])] = ep["id"]
                self.detector.mark_open(entity=ep["entity"], cause=ep["cause"], severity=ep["severity"])

    def _replay(self, conn, cluster: str, cluster_until: float | None, node_until: dict[str, float]) -> None:
        # Everything read but not yet judged is re-read, and the window before it warms the
        # rates and the windowed rules; nothing at or before its node's judged instant is
        # judged again. (A node without a progress row of its own, saved by a detector that
        # kept one per cluster, resumes at its cluster's.)
        for node, until in node_until.items():
            self.detector.resume_at(cluster, node, until)
        known = [t for t in (cluster_until, *node_until.values()) if t is not None]
        horizon = min(known) - max(self.cfg.rate_window_s, self.cfg.stale_after_s) - 1.0
        entries = [dict(r) for r in conn.execute(
            select(LogT).join(NodeT, NodeT.c.id == LogT.c.node_id)
            .where(NodeT.c.cluster == cluster, LogT.c.max_ts > horizon, LogT.c.id <= self.cursor.low_water)
        ).mappings()]
        fallback = NEVER if cluster_until is None else cluster_until
        for item in load_instants(conn, entries):
            until = node_until.get(item.node, fallback)
            if item.ts <= until:
                self.detector.resume_at(cluster, item.node, until)
                if item.ts > until - max(self.cfg.rate_window_s, self.cfg.stale_after_s) - 1.0:
                    self.detector.warm(item)
            else:
                self.detector.add(item)

    def _store(self, conn, change: EpisodeChange) -> None:
        key = (change.entity, change.cause)
        event = change.change
        if isinstance(event, Opened):
            self.open_ids[key] = episodes.open_episode(
                conn, cluster=change.cluster, node=change.node, gpu=change.gpu, uuid=change.uuid, entity=change.entity,
                cause=change.cause, severity=event.finding.severity, onset=event.onset, detected_at=event.detected_at,
                evidence=_jsonable(event.finding.evidence), summary=event.finding.summary,
            )
            record_episode_change(conn, episode_id=self.open_ids[key], change="opened")  # alert outbox (issue #5)
        elif isinstance(event, Escalated) and key in self.open_ids:
            episodes.escalate_episode(conn, episode_id=self.open_ids[key], severity=event.finding.severity,
                                      evidence=_jsonable(event.finding.evidence), summary=event.finding.summary)
            record_episode_change(conn, episode_id=self.open_ids[key], change="escalated")  # alert outbox (issue #5)
        elif isinstance(event, Resolved) and key in self.open_ids:
            episode_id = self.open_ids.pop(key)
            episodes.resolve_episode(conn, episode_id=episode_id, resolved_at=event.resolved_at)
            record_episode_change(conn, episode_id=episode_id, change="resolved")  # alert outbox (issue #5)

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.lock.try_acquire() or not self.lock.still_held():
                # Another process leads; if it dies its lock goes with it and we take over
                # within leader_retry_s.
                self.detector = None
                self._stop.wait(self.leader_retry_s)
                continue
            try:
                self.run_once()
            except Exception:
                log.exception("detection cycle failed; state is rebuilt from storage")
                self.detector = None
                self._stop.wait(self.leader_retry_s)
                continue
            self._stop.wait(self.poll_s)


def _late_by_cluster(late: dict[tuple[str, str], tuple[int, float]]) -> list[tuple[str, dict[str, str], float]]:
    per_cluster: dict[str, int] = {}
    for (cluster, _node), (count, _behind) in late.items():
        per_cluster[cluster] = per_cluster.get(cluster, 0) + count
    return [(LATE_SAMPLES, {"cluster": cluster}, n) for cluster, n in sorted(per_cluster.items())]


def _jsonable(evidence: dict) -> dict:
    return json.loads(json.dumps(evidence, default=str))
