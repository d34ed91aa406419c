"""One validated Batch as rows (prepare), then a group of batches' rows in bulk (insert)."""

from __future__ import annotations

import time
from itertools import chain
from typing import Any, NamedTuple

from sqlalchemy import Column, Connection, Float, Integer, MetaData, Table, bindparam, func, insert, update

from server.protocol import DEFAULT_CLUSTER, GPU_METRICS, NIC_METRICS, Batch
from server.store import schema
from server.store.bulk_insert import BulkInsert
from server.store.ids import IdResolver

# `lost` defaults to False, not NULL: it is a flag, not a reading.
_GPU_READINGS = tuple(m for m in GPU_METRICS if m != "lost")
assert GPU_METRICS[0] == "lost", "gpu_samples column order: lost, then readings"

# The XID id is assigned by the database; the insert names only the natural key.
_XID_KEY = Table("xid_events", MetaData(), Column("gpu_id", Integer), Column("xid", Integer), Column("ts", Float))


class SampleWriter:
    """Holds the per-dialect insert statements."""

    def __init__(self, dialect_name: str):
        self.gpu_insert = BulkInsert(dialect_name, schema.GpuSample.__table__)
        self.nic_insert = BulkInsert(dialect_name, schema.NicSample.__table__)
        self.xid_insert = BulkInsert(dialect_name, _XID_KEY)
        greatest = func.max if dialect_name == "sqlite" else func.greatest
        # Built once so that SQLAlchemy's compiled cache serves every batch.
        self.touch_node = (
            update(schema.Node)
            .where(schema.Node.id == bindparam("node_id"))
            .values(last_seen=greatest(schema.Node.last_seen, bindparam("seen")), labels=bindparam("labels"), agent=bindparam("agent"))
        )

        self.log_batch = insert(schema.IngestLog)

    def prepare(self, ids: IdResolver, batch: Batch) -> PreparedBatch:
        """Rows for a batch. With an offline resolver this runs outside the transaction and
        raises CacheMiss when a node, GPU or NIC is new."""
        samples = batch["samples"]
        stamps = [s["ts"] for s in samples] or [0.0]
        node_id = ids.node_id(cluster=batch.get("cluster", DEFAULT_CLUSTER), name=batch["node"], seen=min(stamps))
        gpu_rows, nic_rows, xid_rows = [], [], []
        # Every sample of a batch names the same GPUs and NICs: ask the resolver once per GPU
        # (again only if its slot or model changes within the batch) and once per NIC.
        gpu_ids: dict[str, tuple[tuple, int]] = {}
        nic_ids: dict[tuple[str, int], int] = {}
        for sample in samples:
            ts = sample["ts"]
            for gpu in sample.get("gpus", ()):
                get = gpu.get
                uuid, identity = gpu["uuid"], (gpu["index"], get("model"), get("pci_bus_id"))
                known = gpu_ids.get(uuid)
                if known is None or known[0] != identity:
                    index, model, pci_bus_id = identity
                    known = gpu_ids[uuid] = (identity, ids.gpu_id(node_id=node_id, uuid=uuid, index=index, model=model, pci_bus_id=pci_bus_id, seen=ts))
                gpu_id = known[1]
                gpu_rows.append((gpu_id, ts, get("lost", False), *map(get, _GPU_READINGS)))
                xids = get("xids")
                if xids:
                    xid_rows.extend([(gpu_id, x["xid"], x["ts"]) for x in xids])
            for nic in sample.get("nics", ()):
                key = (nic["device"], nic["port"])
                nic_id = nic_ids.get(key)
                if nic_id is None:
                    nic_id = nic_ids[key] = ids.nic_id(node_id=node_id, device=key[0], port=key[1], seen=ts)
                nic_rows.append((nic_id, ts, *map(nic.get, NIC_METRICS)))
        touch = {"node_id": node_id, "seen": max(stamps), "labels": batch.get("labels", {}), "agent": batch.get("agent")}
        logged = {"node_id": node_id, "min_ts": min(stamps), "max_ts": max(stamps), "samples": len(samples)}
        return PreparedBatch(len(samples), touch, logged, gpu_rows, nic_rows, xid_rows)

    def insert(self, conn: Connection, batches: list[PreparedBatch]) -> None:
        """All rows of a group commit: one bulk insert per table, not per batch, so the write
        turn runs few statements and SQLAlchemy's per-statement cost is paid once."""
        batches = [b for b in batches if b.samples]
        if not batches:
            return
        self.gpu_insert.execute(conn, list(chain.from_iterable(b.gpu_rows for b in batches)))
        self.nic_insert.execute(conn, list(chain.from_iterable(b.nic_rows for b in batches)))
        self.xid_insert.execute(conn, list(chain.from_iterable(b.xid_rows for b in batches)))
        conn.execute(self.touch_node, [b.touch for b in batches])
        # In the same transaction: the detector learns of exactly the batches committed.
        committed_at = time.time()
        conn.execute(self.log_batch, [b.logged | {"committed_at": committed_at} for b in batches])


class PreparedBatch(NamedTuple):
    samples: int
    touch: dict[str, Any]
    logged: dict[str, Any]
    gpu_rows: list[tuple]
    nic_rows: list[tuple]
    xid_rows: list[tuple]
