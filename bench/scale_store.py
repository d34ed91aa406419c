"""bench/scale.py --service: the same fleet written to a real database first, so the detection
service's storage read (server/detect/source.py: the ingest log, then the sample rows behind
it) is timed with the engine, as the service runs them.

The rows go in through SQLAlchemy Core inserts (not the HTTP ingest path: that is
bench/ingest.py's business), one ingest-log entry per node and instant as the collector
commits them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from tempfile import TemporaryDirectory

from sqlalchemy import Engine, insert

from server.detect.engine import NodeInstant
from server.protocol import GPU_METRICS, NIC_METRICS
from server.store import migrate, schema
from server.store.engine import SQLITE_MMAP_MB, make_engine

NodeT, GpuT, NicT = schema.Node.__table__, schema.Gpu.__table__, schema.Nic.__table__
GpuSampleT, NicSampleT, LogT = schema.GpuSample.__table__, schema.NicSample.__table__, schema.IngestLog.__table__


@contextmanager
def database(url: str | None, *, sqlite_mmap_mb: int = SQLITE_MMAP_MB) -> Iterator[Engine]:
    """A migrated database: the given URL, or a fresh SQLite file."""
    with TemporaryDirectory() as tmp:
        engine = make_engine(url or f"sqlite:///{Path(tmp) / 'scale.db'}", sqlite_mmap_mb=sqlite_mmap_mb)
        migrate.upgrade(engine)
        try:
            yield engine
        finally:
            engine.dispose()


class FleetWriter:
    """Writes NodeInstants (bench/scale.py's fleet) as the collector stores them."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.node_ids: dict[str, int] = {}
        self.gpu_ids: dict[str, int] = {}
        self.nic_ids: dict[tuple[str, str, int], int] = {}

    def write(self, items: list[NodeInstant]) -> None:
        with self.engine.begin() as conn:
            self._register(conn, items)
            gpu_rows = [{"gpu_id": self.gpu_ids[r["uuid"]], "ts": it.ts, **{m: r.get(m) for m in GPU_METRICS}}
                        for it in items for r in it.gpu_rows]
            nic_rows = [{"nic_id": self.nic_ids[(it.node, r["device"], r["port"])], "ts": it.ts, **{m: r.get(m) for m in NIC_METRICS}}
                        for it in items for r in it.nic_rows]
            conn.execute(insert(GpuSampleT), gpu_rows)
            conn.execute(insert(NicSampleT), nic_rows)
            now = time.time()
            conn.execute(insert(LogT), [{"node_id": self.node_ids[it.node], "min_ts": it.ts, "max_ts": it.ts,
                                         "samples": len(it.gpu_rows), "committed_at": now} for it in items])

    def _register(self, conn, items: list[NodeInstant]) -> None:
        for it in items:
            if it.node in self.node_ids:
                continue
            node_id = conn.execute(insert(NodeT).values(cluster=it.cluster, name=it.node, labels=it.labels, first_seen=it.ts,
                                                        last_seen=it.ts)).inserted_primary_key[0]
            self.node_ids[it.node] = node_id
            for r in it.gpu_rows:
                self.gpu_ids[r["uuid"]] = conn.execute(insert(GpuT).values(uuid=r["uuid"], node_id=node_id, index=r["index"],
                                                                           model=r["model"], first_seen=it.ts)).inserted_primary_key[0]
            for r in it.nic_rows:
                self.nic_ids[(it.node, r["device"], r["port"])] = conn.execute(
                    insert(NicT).values(node_id=node_id, device=r["device"], port=r["port"], first_seen=it.ts)).inserted_primary_key[0]
