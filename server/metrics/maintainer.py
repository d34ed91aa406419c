"""Keeping the database counters current, on one background thread per process:

- every process adds its ingest request counts (IngestRecorder) to the shared counters;
- the process that leads detection also follows ingest_log and xid_events by id and counts each
  new row once: committed batches and samples per cluster, XID events per GPU and XID code. The
  read position is stored with the counts in one transaction, so a restart neither loses nor
  repeats a row; counting from the rows as they arrive (not counting the rows present) keeps
  the counters monotonic when retention deletes old rows.

Ids are assigned at insert but may commit out of order (PostgreSQL, several writer threads) or
never (a rolled-back or conflicting insert leaves a hole): the tail stops at a hole and steps
over it once it is gap_timeout_s old, as the detector's log cursor does.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Engine, text

from server.metrics.ingest import IngestRecorder
from server.metrics.settings import MetricsSettings
from server.store import counters
from server.store.write_lock import WriteTurn

log = logging.getLogger(__name__)

WATERMARK = "_watermark"
SAMPLES = "laggard_ingest_samples_total"
BATCHES = "laggard_ingest_batches_total"
XIDS = "laggard_gpu_xid_errors_total"
TAIL_LIMIT = 5000


@dataclass(frozen=True)
class _Tail:
    table: str
    sql: str  # rows with id > :low, ordered by id; first column the id


_INGEST_LOG = _Tail(
    "ingest_log",
    "SELECT l.id, n.cluster, l.samples FROM ingest_log l JOIN nodes n ON n.id = l.node_id "
    "WHERE l.id > :low ORDER BY l.id LIMIT :limit",
)
_XID_EVENTS = _Tail(
    "xid_events",
    'SELECT x.id, n.cluster, n.name, g."index", g.uuid, x.xid FROM xid_events x '
    "JOIN gpus g ON g.id = x.gpu_id JOIN nodes n ON n.id = g.node_id "
    "WHERE x.id > :low ORDER BY x.id LIMIT :limit",
)


class _Hole:
    """Where the tail waits, and since when (monotonic)."""

    def __init__(self) -> None:
        self.at: int | None = None
        self.since = 0.0


class MetricsMaintainer:
    def __init__(self, engine: Engine, cfg: MetricsSettings, recorder: IngestRecorder, *, is_leader: Callable[[], bool],
                 clock: Callable[[], float] = time.monotonic):
        self.engine = engine
        self.cfg = cfg
        self.recorder = recorder
        self.is_leader = is_leader
        self.clock = clock
        self._turn = WriteTurn.for_engine(engine)
        self._holes = {t.table: _Hole() for t in (_INGEST_LOG, _XID_EVENTS)}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-maintainer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)
        try:
            self.flush()
        except Exception:
            log.warning("final metrics flush failed; up to %.0f s of ingest request counts are lost", self.cfg.flush_interval_s)
        self._turn.close()

    def run_once(self) -> None:
        self.flush()
        if self.is_leader():
            self.tail(_INGEST_LOG, self._count_batches)
            self.tail(_XID_EVENTS, self._count_xids)

    def flush(self) -> None:
        deltas = self.recorder.drain()
        if not deltas:
            return
        try:
            with self._turn.held(), self.engine.begin() as conn:
                counters.add(conn, deltas)
        except Exception:
            self.recorder.restore(deltas)
            raise

    def tail(self, tail: _Tail, count: Callable[[list], list[tuple[str, dict[str, str], float]]]) -> int:
        """Count the rows of `tail` committed since last time; returns how many were counted."""
        hole = self._holes[tail.table]
        with self._turn.held(), self.engine.begin() as conn:
            mark = {"table": tail.table}
            # A write first: on SQLite it takes the write lock before anything is read, so the
            # read position cannot move under us; on PostgreSQL FOR UPDATE does the same.
            counters.add(conn, [(WATERMARK, mark, 0.0)])
            low = counters.get_value(conn, WATERMARK, mark, for_update=True)
            if low is None:
                low = self._start(conn, tail.table)
            low = int(low)
            rows = conn.execute(text(tail.sql), {"low": low, "limit": TAIL_LIMIT}).all()
            if not rows and conn.dialect.name == "sqlite":
                low = self._reused_ids(conn, tail.table, low)
                rows = conn.execute(text(tail.sql), {"low": low, "limit": TAIL_LIMIT}).all()
            taken, new_low = self._contiguous(rows, low, hole)
            if new_low == low:
                return 0
            counters.add(conn, count(taken))
            counters.set_value(conn, WATERMARK, mark, new_low)
        return len(taken)

    def _start(self, conn, table: str) -> int:
        """A table never followed before: count what it holds now, from its first id."""
        first = conn.execute(text(f"SELECT min(id) FROM {table}")).scalar()
        return 0 if first is None else int(first) - 1

    @staticmethod
    def _reused_ids(conn, table: str, low: int) -> int:
        """SQLite gives a table without AUTOINCREMENT (xid_events) the next id after the largest
        one present: once retention has deleted its newest rows, ids are handed out again below
        the read position. Retention deletes oldest first, so then every row left is new."""
        top = conn.execute(text(f"SELECT max(id) FROM {table}")).scalar()
        if top is None:
            return 0
        if top < low:
            return int(conn.execute(text(f"SELECT min(id) FROM {table}")).scalar()) - 1
        return low

    def _contiguous(self, rows: list, low: int, hole: _Hole) -> tuple[list, int]:
        taken = []
        at = low
        for row in rows:
            if row[0] != at + 1:
                now = self.clock()
                if hole.at != at + 1:
                    hole.at, hole.since = at + 1, now
                if now - hole.since < self.cfg.gap_timeout_s:
                    break
                log.debug("metrics tail: stepping over ids %d..%d (never committed)", at + 1, row[0] - 1)
                hole.at = None
            taken.append(row)
            at = row[0]
        return taken, at

    @staticmethod
    def _count_batches(rows: list) -> list[tuple[str, dict[str, str], float]]:
        samples: dict[str, float] = defaultdict(float)
        batches: dict[str, float] = defaultdict(float)
        for _, cluster, n in rows:
            samples[cluster] += n
            batches[cluster] += 1
        return [(SAMPLES, {"cluster": c}, v) for c, v in samples.items()] + [(BATCHES, {"cluster": c}, v) for c, v in batches.items()]

    @staticmethod
    def _count_xids(rows: list) -> list[tuple[str, dict[str, str], float]]:
        seen: dict[tuple, float] = defaultdict(float)
        for _, cluster, node, index, uuid, xid in rows:
            seen[(cluster, node, str(index), uuid, str(xid))] += 1
        return [(XIDS, {"cluster": c, "node": n, "gpu": g, "uuid": u, "xid": x}, v) for (c, n, g, u, x), v in seen.items()]

    def _run(self) -> None:
        while not self._stop.wait(self.cfg.flush_interval_s):
            try:
                self.run_once()
            except Exception:
                log.exception("metrics counters update failed; will retry")
