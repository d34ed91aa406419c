"""Time partitions of the sample tables on PostgreSQL: one RANGE partition per UTC day of sample
time (`ts`, epoch seconds), created a few days ahead, plus a DEFAULT partition that takes any
sample no day partition covers (back-filled or from before partitioning), so no sample is ever
refused. Retention drops whole day partitions instead of deleting rows. SQLite keeps plain
tables: every function here does nothing there."""

from __future__ import annotations

import re
import time
import zlib
from datetime import datetime, timezone

from sqlalchemy import Connection, Engine, text

DAY_S = 86400
TABLES = ("gpu_samples", "nic_samples")
DAYS_AHEAD = 2  # today and the next two days exist at any time: maintenance may miss a run or two
_NAME = re.compile(r"^(gpu_samples|nic_samples)_(p\d{8}|default)$")
_LOCK_KEY = zlib.crc32(b"laggard-partitions")


def is_partition_name(name: str | None) -> bool:
    """True for a partition's own table name (schema comparison looks at the parents only)."""
    return bool(name and _NAME.match(name))


def day_partition(table: str, day_start: int) -> str:
    return f"{table}_p{datetime.fromtimestamp(day_start, timezone.utc):%Y%m%d}"


def default_partition(table: str) -> str:
    return f"{table}_default"


def is_partitioned(conn: Connection, table: str) -> bool:
    if conn.dialect.name != "postgresql":
        return False
    return conn.execute(text("SELECT 1 FROM pg_partitioned_table p JOIN pg_class c ON c.oid = p.partrelid "
                             "WHERE c.relname = :t AND pg_table_is_visible(c.oid)"), {"t": table}).first() is not None


def day_partitions(conn: Connection, table: str) -> dict[str, tuple[float, float]]:
    """{partition name: (from, to)} of the day partitions of `table` (the default left out)."""
    rows = conn.execute(text(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = :t AND pg_table_is_visible(p.oid)"
    ), {"t": table}).all()
    out = {}
    for name, bound in rows:
        found = re.findall(r"'?(-?[\d.e+]+)'?", bound.split("FROM", 1)[-1]) if "FROM" in bound else []
        if len(found) == 2:
            out[name] = (float(found[0]), float(found[1]))
    return out


def ensure_partitions(engine: Engine, *, now: float | None = None, days_back: int = 1, days_ahead: int = DAYS_AHEAD) -> list[str]:
    """Create the day partitions from `days_back` days before today to `days_ahead` after;
    returns those created. Idempotent, and safe from several replicas at once."""
    if engine.dialect.name != "postgresql":
        return []
    today = int((time.time() if now is None else now) // DAY_S) * DAY_S
    created = []
    with engine.begin() as conn:
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _LOCK_KEY})
        for table in TABLES:
            if not is_partitioned(conn, table):
                continue
            existing = day_partitions(conn, table)
            for day in range(today - days_back * DAY_S, today + (days_ahead + 1) * DAY_S, DAY_S):
                name = day_partition(table, day)
                if name not in existing:
                    create_day_partition(conn, table, day)
                    created.append(name)
    return created


def create_day_partition(conn: Connection, table: str, day_start: int) -> None:
    """Attach a new partition for [day_start, day_start + 1 day), first moving into it any rows
    of that day the default partition holds (attaching with them there would fail)."""
    name, default = day_partition(table, day_start), default_partition(table)
    lo, hi = float(day_start), float(day_start + DAY_S)
    conn.execute(text(f'CREATE TABLE "{name}" (LIKE "{table}" INCLUDING DEFAULTS INCLUDING CONSTRAINTS)'))
    conn.execute(text(f'WITH moved AS (DELETE FROM "{default}" WHERE ts >= :lo AND ts < :hi RETURNING *) '
                      f'INSERT INTO "{name}" SELECT * FROM moved'), {"lo": lo, "hi": hi})
    conn.execute(text(f'ALTER TABLE "{table}" ATTACH PARTITION "{name}" FOR VALUES FROM ({lo!r}) TO ({hi!r})'))


def drop_expired(conn: Connection, table: str, *, cutoff: float) -> int:
    """Drop the day partitions that end at or before `cutoff`; returns their rows (the
    planner's estimate: counting a day of samples exactly would read all of it)."""
    rows = 0
    for name, (_lo, hi) in sorted(day_partitions(conn, table).items()):
        if hi <= cutoff:
            estimate = conn.execute(text("SELECT reltuples FROM pg_class WHERE relname = :n"), {"n": name}).scalar()
            if estimate is None or estimate < 0:  # never analysed
                estimate = conn.execute(text(f'SELECT count(*) FROM "{name}"')).scalar()
            conn.execute(text(f'DROP TABLE "{name}"'))
            rows += int(estimate)
    return rows


# --- conversion (migration 0004): the same columns, keys and data, another table kind --------

_FOREIGN_KEYS = {"gpu_samples": ("gpu_id", "gpus"), "nic_samples": ("nic_id", "nics")}


def convert(conn: Connection, table: str, *, partitioned: bool, now: float | None = None) -> None:
    """Rebuild `table` as a partitioned table (with a default partition and a day partition for
    every day that has rows, and the days ahead) or back as a plain one, keeping every row."""
    column, parent = _FOREIGN_KEYS[table]
    old = f"{table}_unpartitioned" if partitioned else f"{table}_partitioned"
    conn.execute(text(f'ALTER TABLE "{table}" RENAME TO "{old}"'))
    conn.execute(text(f'ALTER INDEX "{table}_pkey" RENAME TO "{old}_pkey"'))
    kind = " PARTITION BY RANGE (ts)" if partitioned else ""
    conn.execute(text(f'CREATE TABLE "{table}" (LIKE "{old}" INCLUDING DEFAULTS INCLUDING CONSTRAINTS){kind}'))
    conn.execute(text(f'ALTER TABLE "{table}" ADD CONSTRAINT "{table}_pkey" PRIMARY KEY ({column}, ts)'))
    conn.execute(text(f'ALTER TABLE "{table}" ADD CONSTRAINT "{table}_{column}_fkey" FOREIGN KEY ({column}) REFERENCES {parent} (id)'))
    if partitioned:
        conn.execute(text(f'CREATE TABLE "{default_partition(table)}" PARTITION OF "{table}" DEFAULT'))
        today = int((time.time() if now is None else now) // DAY_S) * DAY_S
        days = set(conn.execute(text(f'SELECT DISTINCT floor(ts / {DAY_S})::bigint * {DAY_S} FROM "{old}"')).scalars())
        days |= {today + k * DAY_S for k in range(-1, DAYS_AHEAD + 1)}
        for day in sorted(days):
            create_day_partition(conn, table, int(day))
    conn.execute(text(f'INSERT INTO "{table}" SELECT * FROM "{old}"'))
    conn.execute(text(f'DROP TABLE "{old}"'))
