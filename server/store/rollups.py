"""Per-minute rollups of the raw samples (issue #17), computed incrementally.

A minute is rolled up once it is closed: `delay_s` (the lateness allowance) behind now, so that
agents' late pushes have landed. Each run rolls the closed minutes after `through_minute` in
steps of ten minutes (an hour at most per run), the progress row moving after each step: a
crash loses at most the step under way, which the next run does again. Within a step, each
chunk of series is aggregated in a read transaction and written in a short write transaction
of its own (SQLite has one writer: ingest must not wait for the aggregation). Rows are upserted
from the raw samples of the whole minute, so doing a minute twice gives the same row
(idempotent). Only series whose node reported since the step began are read.

A batch stored after its minutes were rolled up (an agent replaying its spool after an outage)
is found in the ingest log: the minutes it covers are rolled up again for its node, as long as
its raw samples are still kept.

The raw tables have no index on ts alone (server/store/schema.py): every read here goes through
the (series id, ts) primary key, a chunk of series ids at a time."""

from __future__ import annotations

import math
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, Integer, Table, func, insert, literal_column, select, update
from sqlalchemy.dialects import postgresql, sqlite

from server.store import schema

IDS_PER_QUERY = 200  # series per read and per write transaction
STEP_MINUTES = 10  # minutes per step; the progress row moves after each
MAX_STEPS_PER_RUN = 6  # a run catches up an hour at most: a backlog is worked off over several runs
# The ingest log's ids are assigned at insert, not at commit: a batch committed late can carry an
# id below one already seen. Log rows committed this recently are looked at again next run.
LOG_SETTLE_S = 60.0


@dataclass(frozen=True)
class RolledTable:
    """A raw sample table and its rollup: series key column, inventory table of the series."""

    samples: Table
    rollup: Table
    key: str
    inventory: Table

    @property
    def gauges(self) -> tuple[str, ...]:
        return tuple(c.name[: -len("_min")] for c in self.rollup.columns if c.name.endswith("_min"))

    @property
    def last_values(self) -> tuple[str, ...]:
        gauges = set(self.gauges)
        return tuple(c.name for c in self.samples.columns[2:] if c.name not in gauges)


GPU = RolledTable(schema.GpuSample.__table__, schema.GpuRollupT, "gpu_id", schema.Gpu.__table__)
NIC = RolledTable(schema.NicSample.__table__, schema.NicRollupT, "nic_id", schema.Nic.__table__)
TABLES = (GPU, NIC)
ProgressT = schema.RollupProgress.__table__
LogT = schema.IngestLog.__table__
NodeT = schema.Node.__table__
_SIXTY = literal_column("60.0")  # a float literal: a bound 60 would make PostgreSQL divide as numeric


def roll_up(engine: Engine, *, now: float, delay_s: float, keep_raw_s: float) -> dict[str, int]:
    """Roll up every closed minute not yet rolled up, and again those a late batch touched;
    returns rows written per rollup table. `keep_raw_s`: how far back raw samples are kept
    (where a first run starts)."""
    closed = math.floor((now - delay_s) / 60)
    oldest = math.floor((now - keep_raw_s) / 60)
    return {t.rollup.name: _roll_table(engine, t, closed=closed, oldest=oldest, now=now) for t in TABLES}


def _roll_table(engine: Engine, table: RolledTable, *, closed: int, oldest: int, now: float) -> int:
    with engine.begin() as conn:
        through, log_id = _progress(conn, table, default=max(oldest, _first_minute(conn, default=closed)))
        settled = conn.execute(select(func.max(LogT.c.id)).where(LogT.c.committed_at < now - LOG_SETTLE_S)).scalar() or 0
        late = _late_batches(conn, log_id=log_id, before=through)
    written = _roll_late(engine, table, late, before=through, oldest=oldest)
    with engine.begin() as conn:
        _save_progress(conn, table, through, max(log_id, settled))
    start, steps = max(through, oldest), 0
    while start < closed and steps < MAX_STEPS_PER_RUN:
        end = min(start + STEP_MINUTES, closed)
        with engine.connect() as conn:
            ids = _series_seen_since(conn, table, start)
        written += _roll_minutes(engine, table, ids=ids, first=start, end=end)
        with engine.begin() as conn:
            conn.execute(update(ProgressT).where(ProgressT.c.samples_table == table.samples.name).values(through_minute=end))
        start, steps = end, steps + 1
    return written


def _first_minute(conn: Connection, *, default: int) -> int:
    """The minute of the first sample any node sent (a first run starts there, not a whole raw
    horizon of empty minutes earlier)."""
    first = conn.execute(select(func.min(NodeT.c.first_seen))).scalar()
    return default if first is None else math.floor(first / 60)


def _progress(conn: Connection, table: RolledTable, *, default: int) -> tuple[int, int]:
    row = conn.execute(select(ProgressT.c.through_minute, ProgressT.c.log_id).where(ProgressT.c.samples_table == table.samples.name)).first()
    if row is not None:
        return row.through_minute, row.log_id
    log_id = conn.execute(select(func.max(LogT.c.id))).scalar() or 0
    conn.execute(insert(ProgressT).values(samples_table=table.samples.name, through_minute=default, log_id=log_id))
    return default, log_id


def _save_progress(conn: Connection, table: RolledTable, through: int, log_id: int) -> None:
    conn.execute(update(ProgressT).where(ProgressT.c.samples_table == table.samples.name).values(through_minute=through, log_id=log_id))


def _late_batches(conn: Connection, *, log_id: int, before: int) -> list[tuple[int, float, float]]:
    """Per node, the sample-time span of the batches logged after `log_id` that reach before
    minute `before` (already rolled up)."""
    return [tuple(row) for row in conn.execute(
        select(LogT.c.node_id, func.min(LogT.c.min_ts), func.max(LogT.c.max_ts))
        .where(LogT.c.id > log_id, LogT.c.min_ts < before * 60)
        .group_by(LogT.c.node_id)
    ).all()]


def _roll_late(engine: Engine, table: RolledTable, late: list[tuple[int, float, float]], *, before: int, oldest: int) -> int:
    """Roll up again, node by node, the minutes before `before` that late batches covered."""
    written = 0
    for node_id, min_ts, max_ts in late:
        first = max(math.floor(min_ts / 60), oldest)
        end = min(math.floor(max_ts / 60) + 1, before)
        if first < end:
            with engine.connect() as conn:
                ids = conn.execute(select(table.inventory.c.id).where(table.inventory.c.node_id == node_id)).scalars().all()
            written += _roll_minutes(engine, table, ids=ids, first=first, end=end)
    return written


def _series_seen_since(conn: Connection, table: RolledTable, minute: int) -> list[int]:
    """Series whose node has reported since the minute began: nodes long gone (or names an
    agent invented once) are not probed minute after minute."""
    inventory = table.inventory
    return conn.execute(
        select(inventory.c.id).join(NodeT, NodeT.c.id == inventory.c.node_id).where(NodeT.c.last_seen >= minute * 60)
        .order_by(inventory.c.id)
    ).scalars().all()


def _roll_minutes(engine: Engine, table: RolledTable, *, ids: list[int], first: int, end: int) -> int:
    """Upsert the rollups of minutes [first, end) of these series from their raw samples, a
    chunk of series at a time: each chunk is read in a read transaction and written in a short
    write transaction of its own, so that SQLite's one writer (ingest) never waits for the
    aggregation itself."""
    written = 0
    columns = [table.key, "minute", "samples", *_stat_columns(table), *table.last_values]
    for i in range(0, len(ids), IDS_PER_QUERY):
        with engine.connect() as conn:
            rows = conn.execute(_minutes_from_raw(conn, table, ids[i : i + IDS_PER_QUERY], first, end)).all()
        if rows:
            with engine.begin() as conn:
                conn.execute(_upsert(conn, table, columns), [dict(zip(columns, row)) for row in rows])
            written += len(rows)
    return written


def _upsert(conn: Connection, table: RolledTable, columns: list[str]):
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    stmt = dialect.insert(table.rollup)
    return stmt.on_conflict_do_update(index_elements=[table.key, "minute"], set_={c: stmt.excluded[c] for c in columns[2:]})


def _stat_columns(table: RolledTable) -> list[str]:
    return [f"{g}_{s}" for g in table.gauges for s in schema.ROLLUP_STATS]


def _minutes_from_raw(conn: Connection, table: RolledTable, ids: list[int], first: int, end: int):
    """Rows in the rollup's column order for minutes [first, end) of these series, from raw."""
    raw, key = table.samples, table.samples.c[table.key]
    minute = _minute_of(conn, raw.c.ts)
    stats = []
    for gauge in table.gauges:
        stats += [func.min(raw.c[gauge]).label(f"{gauge}_min"), func.avg(raw.c[gauge]).label(f"{gauge}_mean"),
                  func.max(raw.c[gauge]).label(f"{gauge}_max")]
    per_minute = (
        select(key.label("series"), minute.label("minute"), func.count().label("samples"), func.max(raw.c.ts).label("last_ts"), *stats)
        .where(key.in_(ids), raw.c.ts >= first * 60, raw.c.ts < end * 60)
        .group_by(key, literal_column("minute"))
        .subquery()
    )
    last = raw.alias("last")
    # A plain WHERE, not JOIN ... ON: SQLite would read an upsert's ON CONFLICT as the join's ON.
    return select(
        per_minute.c.series, per_minute.c.minute, per_minute.c.samples, *[per_minute.c[c] for c in _stat_columns(table)],
        *[last.c[name] for name in table.last_values],
    ).where(last.c[table.key] == per_minute.c.series, last.c.ts == per_minute.c.last_ts)


def minute_series(conn: Connection, table: RolledTable, *, series_id: int, reading: str, first: int, end: int,
                  limit: int) -> tuple[list[str], list[tuple]]:
    """One reading of one series per minute over [first, end): the column names and the rows
    (minute start in epoch seconds first; a gauge's mean, min and max, any other reading's last
    value). Minutes not rolled up yet (the newest, still open to late samples) are computed from
    the raw samples, so the series reaches the present."""
    names = [f"{reading}_{s}" for s in ("mean", "min", "max")] if reading in table.gauges else [reading]
    through = conn.execute(select(ProgressT.c.through_minute).where(ProgressT.c.samples_table == table.samples.name)).scalar()
    split = first if through is None else min(max(through, first), end)
    rollup = table.rollup
    stored = conn.execute(
        select(rollup.c.minute, *[rollup.c[n] for n in names])
        .where(rollup.c[table.key] == series_id, rollup.c.minute >= first, rollup.c.minute < split)
        .order_by(rollup.c.minute).limit(limit)
    ).all()
    fresh = []
    if split < end and len(stored) < limit:
        computed = _minutes_from_raw(conn, table, [series_id], split, end).subquery()
        fresh = conn.execute(select(computed.c.minute, *[computed.c[n] for n in names]).order_by(computed.c.minute)
                             .limit(limit - len(stored))).all()
    columns = ["ts", *("mean", "min", "max")] if len(names) == 3 else ["ts", "value"]
    return columns, [(minute * 60, *values) for minute, *values in [*stored, *fresh]]


def _minute_of(conn: Connection, ts):
    # PostgreSQL rounds a float cast to an integer; SQLite truncates (ts > 0: the floor).
    if conn.dialect.name == "postgresql":
        return func.floor(ts / _SIXTY).cast(Integer)
    return (ts / _SIXTY).cast(Integer)
