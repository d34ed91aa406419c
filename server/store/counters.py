"""Counters kept in the database (table metric_counters), so that every worker process and every
replica serves the same value for a counter, and a restart does not reset it.

Three writers add to them, each in the transaction that makes the counted thing true:
- the detector's transaction (server/store/episode_events.py): episodes opened, escalated, resolved;
- the leader's tailer (server/metrics/maintainer.py): committed batches and samples per cluster
  (from ingest_log) and XID events per GPU (from xid_events), each row counted once, before
  retention deletes it;
- every process's flusher (server/metrics/maintainer.py): its ingest requests by status and its
  latency histogram since the last flush (at most flush_interval_s of counts die with a crashed
  process);
- the alert dispatcher: notifications sent and failed per receiver.

Names starting with "_" are bookkeeping (the tailers' read positions) and are never exposed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from sqlalchemy import Connection, select, text

from server.store import schema

CounterT = schema.MetricCounter.__table__

_ADD_SQL = {
    "sqlite": "INSERT INTO metric_counters (name, labels, value) VALUES (?, ?, ?) "
              "ON CONFLICT (name, labels) DO UPDATE SET value = metric_counters.value + excluded.value",
    "postgresql": "INSERT INTO metric_counters (name, labels, value) VALUES (%s, %s, %s) "
                  "ON CONFLICT (name, labels) DO UPDATE SET value = metric_counters.value + excluded.value",
}
_SET_SQL = {
    "sqlite": "INSERT INTO metric_counters (name, labels, value) VALUES (?, ?, ?) "
              "ON CONFLICT (name, labels) DO UPDATE SET value = excluded.value",
    "postgresql": "INSERT INTO metric_counters (name, labels, value) VALUES (%s, %s, %s) "
                  "ON CONFLICT (name, labels) DO UPDATE SET value = excluded.value",
}


def encode_labels(labels: Mapping[str, str]) -> str:
    """The label set as canonical JSON (sorted keys): one row per distinct label set."""
    return json.dumps({k: str(v) for k, v in labels.items()}, sort_keys=True, separators=(",", ":"))


def add(conn: Connection, deltas: Iterable[tuple[str, Mapping[str, str], float]]) -> None:
    """Add each (name, labels, delta) to its counter, creating it at the delta."""
    rows = [(name, encode_labels(labels), float(delta)) for name, labels, delta in deltas if delta]
    if rows:
        conn.exec_driver_sql(_ADD_SQL[conn.dialect.name], rows)


def set_value(conn: Connection, name: str, labels: Mapping[str, str], value: float) -> None:
    conn.exec_driver_sql(_SET_SQL[conn.dialect.name], [(name, encode_labels(labels), float(value))])


def get_value(conn: Connection, name: str, labels: Mapping[str, str], *, for_update: bool = False) -> float | None:
    stmt = select(CounterT.c.value).where(CounterT.c.name == name, CounterT.c.labels == encode_labels(labels))
    if for_update and conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update()
    return conn.execute(stmt).scalar()


def read_all(conn: Connection) -> list[tuple[str, dict[str, str], float]]:
    """Every exposed counter: (name, labels, value)."""
    rows = conn.execute(text("SELECT name, labels, value FROM metric_counters WHERE name NOT LIKE '\\_%' ESCAPE '\\'")).all()
    return [(name, json.loads(labels), value) for name, labels, value in rows]
