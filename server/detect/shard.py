"""One cluster's detection in this process: its detector, its read position in the ingest log,
its open episodes, and the claim that fences its commits (server/detect/leases.py).

Everything a holder needs to resume is stored per cluster in detector_progress, in the same
transaction as the cycle's episode changes: `ingest_log.low_water:<cluster>` (its read position),
`judged_until:<cluster>` (the lag gauge), `judged_node:<cluster>/<node>` (where each node's
judging resumes) and `lease_epoch:<cluster>` (raised by each new holder)."""

from __future__ import annotations

import json
import time
from typing import Any

from sqlalchemy import Connection, Engine, func, select
from sqlalchemy.dialects import postgresql, sqlite

from server.detect.engine import NEVER, Detector, EpisodeChange
from server.detect.persistence import Escalated, Opened, Resolved
from server.detect.settings import DetectionSettings
from server.detect.source import LogCursor, load_instants
from server.store import episode_events, episodes, schema
from server.store.detector_state import CURSOR_PREFIX, EPOCH_PREFIX, JUDGED_PREFIX, LEGACY_CURSOR_KEY, NODE_PREFIX
from server.store.dialect import upsert

ProgressT = schema.DetectorProgress.__table__
LogT, NodeT = schema.IngestLog.__table__, schema.Node.__table__
# A read position that moved over other clusters' entries only is stored at most this often: a
# holder resuming from an older one re-reads nothing of its cluster, only those entries.
CURSOR_SAVE_EVERY_S = 10.0


class Fenced(Exception):
    """Another holder has claimed the cluster since this one did: its judgements are not stored."""


class Shard:
    def __init__(self, cluster: str, cfg: DetectionSettings):
        self.cluster = cluster
        self.cfg = cfg
        self.detector = Detector(cfg)
        self.cursor = LogCursor()
        self.open_ids: dict[tuple[str, str], int] = {}
        self.epoch = 0.0
        self._saved: dict[str, float] = {}
        self._cursor_saved_at = float("-inf")

    @classmethod
    def claim(cls, engine: Engine, cluster: str, cfg: DetectionSettings) -> Shard:
        """Raise the cluster's epoch (committed first: it waits for a commit of the previous holder
        already under way, and refuses any later one), then resume where judging stands."""
        shard = cls(cluster, cfg)
        with engine.begin() as conn:
            shard.epoch = _raise_epoch(conn, cluster)
        with engine.connect() as conn:
            shard._resume(conn)
        return shard

    # --- one cycle's commit ---------------------------------------------------------------

    def fence(self, conn: Connection) -> None:
        """First in the commit's transaction: the epoch row stays locked until the commit."""
        key = f"{EPOCH_PREFIX}{self.cluster}"
        current = conn.execute(select(ProgressT.c.value).where(ProgressT.c.key == key).with_for_update()).scalar()
        if current != self.epoch:
            raise Fenced(f"cluster {self.cluster} claimed by another holder (epoch {current}, ours {self.epoch})")

    def progress(self, judged: dict[tuple[str, str], float]) -> dict[str, float]:
        """The progress rows this cycle changes (none: nothing to commit)."""
        rows = {f"{CURSOR_PREFIX}{self.cluster}": float(self.cursor.low_water)}
        rows.update({f"{JUDGED_PREFIX}{c}": ts for c, ts in self.detector.judged_until().items()})
        rows.update({f"{NODE_PREFIX}{c}/{node}": ts for (c, node), ts in judged.items()})
        rows = {k: v for k, v in rows.items() if self._saved.get(k) != v}
        if list(rows) == [f"{CURSOR_PREFIX}{self.cluster}"] and time.monotonic() - self._cursor_saved_at < CURSOR_SAVE_EVERY_S:
            return {}
        return rows

    def save(self, conn: Connection, rows: dict[str, float]) -> None:
        for key, value in rows.items():
            conn.execute(upsert(conn.dialect.name, ProgressT, {"key": key, "value": value}, key="key"))

    def saved(self, rows: dict[str, float]) -> None:
        """After the commit: what is stored now."""
        self._saved.update(rows)
        if f"{CURSOR_PREFIX}{self.cluster}" in rows:
            self._cursor_saved_at = time.monotonic()

    def store(self, conn: Connection, change: EpisodeChange) -> None:
        key = (change.entity, change.cause)
        event = change.change
        if isinstance(event, Opened):
            self.open_ids[key] = episodes.open_episode(
                conn, cluster=change.cluster, node=change.node, gpu=change.gpu, uuid=change.uuid, entity=change.entity,
                cause=change.cause, severity=event.finding.severity, onset=event.onset, detected_at=event.detected_at,
                evidence=_jsonable(event.finding.evidence), summary=event.finding.summary,
            )
            episode_events.record(conn, episode_id=self.open_ids[key], change="opened")  # read by the outputs
        elif isinstance(event, Escalated) and key in self.open_ids:
            episodes.escalate_episode(conn, episode_id=self.open_ids[key], severity=event.finding.severity,
                                      evidence=_jsonable(event.finding.evidence), summary=event.finding.summary)
            episode_events.record(conn, episode_id=self.open_ids[key], change="escalated")
        elif isinstance(event, Resolved) and key in self.open_ids:
            episode_id = self.open_ids.pop(key)
            episodes.resolve_episode(conn, episode_id=episode_id, resolved_at=event.resolved_at)
            episode_events.record(conn, episode_id=episode_id, change="resolved")

    # --- resuming -------------------------------------------------------------------------

    def _resume(self, conn: Connection) -> None:
        """Pick up where the last holder stopped: its read position, what it had judged, the
        windows it had built (replayed from storage) and the episodes it left open."""
        progress = dict(conn.execute(select(ProgressT.c.key, ProgressT.c.value)).all())
        cluster_until = progress.get(f"{JUDGED_PREFIX}{self.cluster}")
        node_prefix = f"{NODE_PREFIX}{self.cluster}/"
        node_until = {k.removeprefix(node_prefix): v for k, v in progress.items() if k.startswith(node_prefix)}
        own = progress.get(f"{CURSOR_PREFIX}{self.cluster}")
        if own is not None:
            self.cursor.low_water = int(own)
        elif cluster_until is not None or node_until:
            self.cursor.low_water = int(progress.get(LEGACY_CURSOR_KEY, 0))  # judged before sharding
        else:
            self.cursor.low_water = _first_read(conn, self.cluster, progress)
        self._saved = {k: v for k, v in progress.items() if k == f"{CURSOR_PREFIX}{self.cluster}" or k.startswith(node_prefix)}
        if cluster_until is not None:
            self._saved[f"{JUDGED_PREFIX}{self.cluster}"] = cluster_until
        if cluster_until is not None or node_until:
            self._replay(conn, cluster_until, node_until)
        for ep in episodes.active_for_detector(conn, cluster=self.cluster):
            self.open_ids[(ep["entity"], ep["cause"])] = ep["id"]
            self.detector.mark_open(entity=ep["entity"], cause=ep["cause"], severity=ep["severity"])

    def _replay(self, conn: Connection, cluster_until: float | None, node_until: dict[str, float]) -> None:
        # Everything read but not yet judged is re-read, and the window before it warms the
        # rates and the windowed rules; nothing at or before its node's judged instant is
        # judged again. (A node without a progress row of its own, saved by a detector that
        # kept one per cluster, resumes at its cluster's.)
        for node, until in node_until.items():
            self.detector.resume_at(self.cluster, node, until)
        known = [t for t in (cluster_until, *node_until.values()) if t is not None]
        reach = max(self.cfg.rate_window_s, self.cfg.stale_after_s) + 1.0
        entries = [dict(r) for r in conn.execute(
            select(LogT).join(NodeT, NodeT.c.id == LogT.c.node_id)
            .where(NodeT.c.cluster == self.cluster, LogT.c.max_ts > min(known) - reach, LogT.c.id <= self.cursor.low_water)
        ).mappings()]
        fallback = NEVER if cluster_until is None else cluster_until
        for item in load_instants(conn, entries):
            until = node_until.get(item.node, fallback)
            if item.ts <= until:
                self.detector.resume_at(self.cluster, item.node, until)
                if item.ts > until - reach:
                    self.detector.warm(item)
            else:
                self.detector.add(item)


def _raise_epoch(conn: Connection, cluster: str) -> float:
    # One statement, so that two claims can never read the same epoch.
    module = postgresql if conn.dialect.name == "postgresql" else sqlite
    stmt = module.insert(ProgressT).values(key=f"{EPOCH_PREFIX}{cluster}", value=1.0)
    stmt = stmt.on_conflict_do_update(index_elements=["key"], set_={"value": ProgressT.c.value + 1.0})
    return conn.execute(stmt.returning(ProgressT.c.value)).scalar_one()


def _first_read(conn: Connection, cluster: str, progress: dict[str, float]) -> int:
    """Where a cluster nobody has judged yet starts reading: before its first entry still in the
    log. Another cursor's position is no lower bound for it (that cursor stepped over the
    cluster's entries), except for entries committed later: an id below a position a cursor
    already holds was stepped over as a gap, after gap_timeout_s, for every cluster alike."""
    positions = [v for k, v in progress.items() if k.startswith(CURSOR_PREFIX) or k == LEGACY_CURSOR_KEY]
    floor = int(max(positions, default=0))
    first = conn.execute(select(func.min(LogT.c.id)).join(NodeT, NodeT.c.id == LogT.c.node_id)
                         .where(NodeT.c.cluster == cluster)).scalar()
    return floor if first is None else min(floor, first - 1)


def _jsonable(evidence: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(evidence, default=str))
