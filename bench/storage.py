"""Storage per GPU-sample and per GPU-minute (issue #17; docs/operations.md, "Disk").

Writes a fleet (bench/scale.py's: 8 GPUs and 8 IB ports per node, every reading filled in) at
--interval for --minutes into a fresh database, as the collector stores it, then rolls it up
(server/store/rollups.py) and reports the bytes each table takes, indexes included: per raw
GPU-sample (with its node's port samples) and per rolled-up GPU-minute (with its ports'), and
the disk the defaults need per 1,000 GPUs (raw samples 48 h, rollups 30 days).

    python bench/storage.py                                       # SQLite
    python bench/storage.py --database-url postgresql://postgres@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import Engine, func, select, text  # noqa: E402

from bench.ingest import _SIZE_SQL, _fresh_pg  # noqa: E402
from bench.scale import FleetRows  # noqa: E402
from bench.scale_store import FleetWriter, database  # noqa: E402
from server.store import rollups  # noqa: E402

GPUS_PER_NODE = PORTS_PER_NODE = 8


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=32)
    p.add_argument("--minutes", type=int, default=60)
    p.add_argument("--interval", type=float, default=5.0)
    p.add_argument("--database-url", help="a PostgreSQL server URL: a fresh database is made on it; default: a fresh SQLite file")
    p.add_argument("--raw-hours", type=float, default=48.0)
    p.add_argument("--rollup-days", type=float, default=30.0)
    args = p.parse_args()
    url = _fresh_pg(args.database_url, "storage") if args.database_url else None
    with database(url) as engine:
        start = _write_fleet(engine, nodes=args.nodes, minutes=args.minutes, interval=args.interval)
        t0 = time.process_time()
        rollups.roll_up(engine, now=start + args.minutes * 60 + 1, delay_s=0, keep_raw_s=(args.minutes + 1) * 60)
        roll_cpu = time.process_time() - t0
        _report(engine, args, roll_cpu)
    return 0


def _write_fleet(engine: Engine, *, nodes: int, minutes: int, interval: float) -> float:
    fleet, writer = FleetRows(nodes, PORTS_PER_NODE, random.Random(7)), FleetWriter(engine)
    start = (math.floor(time.time() / 60) - minutes - 30) * 60.0
    for step in range(int(minutes * 60 / interval)):
        instants = fleet.instant(step, start + step * interval + 0.5)
        for instant in instants:
            for row in instant.gpu_rows:
                row.update(_readings_of_a_current_gpu(row, step, interval))
        writer.write(instants)
    return start


def _readings_of_a_current_gpu(row: dict, step: int, interval: float) -> dict:
    """What an H100's agent also sends and bench/bodies leaves out (issue #16's readings):
    storage is measured with every column filled in as on a real fleet."""
    return {"energy_mj_total": 10**9 + int(step * interval * row["power_w"] * 1000), "util_enc_pct": 0.0, "util_dec_pct": 0.0,
            "mem_reserved_bytes": 557842432, "remapped_rows_correctable_total": 0, "remapped_rows_uncorrectable_total": 0,
            "remapped_rows_failure": False, "gr_engine_active_pct": row["util_gpu_pct"] * 0.93,
            "dram_active_pct": row["util_gpu_pct"] * 0.41}


def _report(engine: Engine, args, roll_cpu: float) -> None:
    sizes = {t: _table_bytes(engine, t) for t in ("gpu_samples", "nic_samples", "gpu_rollups", "nic_rollups")}
    with engine.connect() as conn:
        rows = {t: conn.execute(select(func.count()).select_from(text(t))).scalar() for t in sizes}
    per_sample = (sizes["gpu_samples"] + sizes["nic_samples"]) / rows["gpu_samples"]
    per_minute = (sizes["gpu_rollups"] + sizes["nic_rollups"]) / rows["gpu_rollups"]
    print(f"{engine.dialect.name}: {args.nodes * GPUS_PER_NODE} GPUs + as many ports, {args.minutes} min at {args.interval:g} s")
    for table, size in sizes.items():
        print(f"  {table:12s} {rows[table]:>9d} rows {size / 1e6:8.1f} MB {size / max(rows[table], 1):6.0f} B/row")
    print(f"  raw: {per_sample:.0f} B per GPU-sample (its ports' samples included); "
          f"rolled up: {per_minute:.0f} B per GPU-minute (ports included), {per_sample * 60 / args.interval / per_minute:.1f}x less")
    print(f"  rolling up: {roll_cpu:.2f} s CPU in this process for {rows['gpu_rollups']} GPU-minutes")
    raw_gb = per_sample * 1000 * args.raw_hours * 3600 / args.interval / 1e9
    rolled_gb = per_minute * 1000 * args.rollup_days * 1440 / 1e9
    print(f"  per 1,000 GPUs at {args.interval:g} s: raw {args.raw_hours:g} h {raw_gb:.1f} GB + rollups {args.rollup_days:g} d "
          f"{rolled_gb:.1f} GB = {raw_gb + rolled_gb:.1f} GB")


def _table_bytes(engine: Engine, table: str) -> int:
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            return int(conn.exec_driver_sql(_SIZE_SQL, {"t": table}).scalar() or 0)
        # dbstat: the pages of the table and of its primary key's index.
        return int(conn.execute(text("SELECT sum(pgsize) FROM dbstat WHERE name = :t OR name LIKE 'sqlite_autoindex_' || :t || '%'"),
                                {"t": table}).scalar() or 0)


if __name__ == "__main__":
    sys.exit(main())
