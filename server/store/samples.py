"""One validated Batch as rows: first keyed by its own GPUs and NICs (unresolved_rows), then
by database ids (prepare); a group of batches' rows in bulk (insert)."""

from __future__ import annotations

import time
from itertools import chain
from operator import attrgetter
from typing import Any, NamedTuple

import msgspec
from sqlalchemy import Column, Connection, Float, Integer, MetaData, Table, bindparam, func, insert, update

from server.protocol import GPU_METRICS, NIC_METRICS
from server.store import schema, workloads
from server.store.bulk_insert import BulkInsert
from server.store.ids import Claimant, IdResolver

# Rows are bound by position (unresolved_rows): after the key and ts, each sample table's columns
# are the wire's readings in order. Both are built from agent/fields.py, so this holds by
# construction; the assertion keeps anyone from building either by hand again.
assert tuple(c.name for c in schema.GpuSample.__table__.columns)[2:] == GPU_METRICS, "gpu_samples columns != protocol GPU keys"
assert tuple(c.name for c in schema.NicSample.__table__.columns)[2:] == NIC_METRICS, "nic_samples columns != protocol NIC keys"

# The XID id is assigned by the database; the insert names only the natural key.
_XID_KEY = Table("xid_events", MetaData(), Column("gpu_id", Integer), Column("xid", Integer), Column("ts", Float))


class SampleWriter:
    """Holds the per-dialect insert statements."""

    def __init__(self, dialect_name: str):
        self.gpu_insert = BulkInsert(dialect_name, schema.GpuSample.__table__)
        self.nic_insert = BulkInsert(dialect_name, schema.NicSample.__table__)
        self.xid_insert = BulkInsert(dialect_name, _XID_KEY)
        self.workloads = workloads.WorkloadWriter(dialect_name)
        greatest = func.max if dialect_name == "sqlite" else func.greatest
        # Built once so that SQLAlchemy's compiled cache serves every batch.
        self.touch_node = (
            update(schema.Node)
            .where(schema.Node.id == bindparam("node_id"))
            .values(last_seen=greatest(schema.Node.last_seen, bindparam("seen")), labels=bindparam("labels"), agent=bindparam("agent"))
        )

        self.log_batch = insert(schema.IngestLog)

    def prepare(self, ids: IdResolver, batch: UnresolvedBatch) -> PreparedBatch:
        """Rows with database ids. With an offline resolver this runs outside the transaction
        and raises CacheMiss when a node, GPU or NIC is new or a GPU moved. In the transaction,
        the caller has checked the batch's GPU claims first (IdResolver.refuse_conflicting_claims)."""
        node_id = ids.node_id(cluster=batch.cluster, name=batch.node, seen=batch.min_ts)
        gpu_ids = [ids.gpu_id(node_id=node_id, uuid=uuid, index=index, model=model, pci_bus_id=pci_bus_id, seen=seen)
                   for uuid, index, model, pci_bus_id, seen in batch.gpus]
        nic_ids = [ids.nic_id(node_id=node_id, device=device, port=port, seen=seen) for device, port, seen in batch.nics]
        touch = {"node_id": node_id, "seen": batch.max_ts, "labels": batch.labels, "agent": batch.agent}
        logged = {"node_id": node_id, "min_ts": batch.min_ts, "max_ts": batch.max_ts, "samples": batch.samples}
        return PreparedBatch(
            batch.samples, touch, logged,
            _with_ids(batch.gpu_rows, gpu_ids, self.gpu_insert.width),
            _with_ids(batch.nic_rows, nic_ids, self.nic_insert.width),
            [(gpu_ids[local], xid, ts) for local, xid, ts in batch.xid_rows],
            [(gpu_ids[row[0]], *row[1:]) for row in batch.workload_rows],
        )

    def insert(self, conn: Connection, batches: list[PreparedBatch]) -> None:
        """All rows of a group commit: one bulk insert per table, not per batch, so the write
        turn runs few statements and SQLAlchemy's per-statement cost is paid once."""
        batches = [b for b in batches if b.samples]
        if not batches:
            return
        self.gpu_insert.execute_flat(conn, list(chain.from_iterable(b.gpu_rows for b in batches)))
        self.nic_insert.execute_flat(conn, list(chain.from_iterable(b.nic_rows for b in batches)))
        self.xid_insert.execute(conn, list(chain.from_iterable(b.xid_rows for b in batches)))
        self.workloads.insert(conn, list(chain.from_iterable(b.workload_rows for b in batches)))
        conn.execute(self.touch_node, [b.touch for b in batches])
        # In the same transaction: the detector learns of exactly the batches committed.
        committed_at = time.time()
        conn.execute(self.log_batch, [b.logged | {"committed_at": committed_at} for b in batches])


def _with_ids(flat: list, ids: list[int], width: int) -> list:
    """Rows laid end to end, each starting with its position in the batch's GPUs (NICs): the
    same rows with database ids there. Column slices instead of one new tuple per row."""
    flat = list(flat)
    flat[0::width] = [ids[local] for local in flat[0::width]]
    return flat


def unresolved_rows(batch: Any, *, clusters: frozenset[str] | None = None, nodes: frozenset[str] | None = None) -> UnresolvedBatch:
    """A validated batch (msgspec Structs, server/ingest/protocol_decoder.py) as rows keyed by the
    batch's own GPUs and NICs (their position in `gpus` / `nics`), not yet by database ids:
    what a writer, in this process or in the writer process (writer_service.py), turns into
    rows to insert. `clusters` and `nodes` are what the pushing token may write (None: any):
    only a GPU held there may be claimed for this batch's node."""
    samples = batch.samples
    stamps = [s.ts for s in samples] or [0.0]
    gpus: dict[tuple, int] = {}  # (uuid, index, model, pci_bus_id) -> position
    nics: dict[tuple[str, int], int] = {}
    gpu_identities, nic_identities, gpu_rows, nic_rows, xid_rows = [], [], [], [], []
    # Workloads as changes (server/store/workloads.py): per GPU position, the last one kept.
    workload_rows: list[tuple] = []
    last_workload: dict[int, tuple] = {}
    for sample in samples:
        ts = sample.ts
        for gpu in sample.gpus:
            # A GPU whose slot or model changes within the batch gets a second identity; the
            # writer resolves them in order, so the latest one is what the database keeps.
            identity = _gpu_identity(gpu)
            local = gpus.get(identity)
            if local is None:
                local = gpus[identity] = len(gpu_identities)
                gpu_identities.append((*identity, ts))
            gpu_rows += (local, ts, *_gpu_readings(gpu))
            if gpu.xids:
                xid_rows.extend([(local, x.xid, x.ts) for x in gpu.xids])
            if gpu.workload is not _UNSET:  # absent: an older agent, nothing to store
                values = workloads.values(gpu.workload)
                if last_workload.get(local) != values:
                    last_workload[local] = values
                    workload_rows.append((local, ts, *values))
        for nic in sample.nics:
            key = (nic.device, nic.port)
            local = nics.get(key)
            if local is None:
                local = nics[key] = len(nic_identities)
                nic_identities.append((*key, ts))
            nic_rows += (local, ts, *_nic_readings(nic))
    return UnresolvedBatch(
        len(samples), batch.cluster, batch.node, batch.labels, batch.agent,
        min(stamps), max(stamps), gpu_identities, nic_identities, gpu_rows, nic_rows, xid_rows, clusters, nodes,
        workload_rows,
    )


# One C call per GPU (NIC) for all its readings, in gpu_samples (nic_samples) column order.
_gpu_identity = attrgetter("uuid", "index", "model", "pci_bus_id")
_gpu_readings = attrgetter(*GPU_METRICS)
_nic_readings = attrgetter(*NIC_METRICS)
_UNSET = msgspec.UNSET


class UnresolvedBatch(NamedTuple):
    samples: int
    cluster: str
    node: str
    labels: dict[str, str]
    agent: dict[str, Any] | None
    min_ts: float
    max_ts: float
    gpus: list[tuple]  # (uuid, index, model, pci_bus_id, first ts), in order of first appearance
    nics: list[tuple]  # (device, port, first ts)
    # Rows laid end to end in one list, gpu_samples (nic_samples) columns in table order, the
    # first holding the position in gpus (nics): cheap to send to the writer process and to
    # bind, and ids go in by slice.
    gpu_rows: list  # position in gpus, ts, lost, readings... (repeated)
    nic_rows: list  # position in nics, ts, readings... (repeated)
    xid_rows: list[tuple]  # (position in gpus, xid, ts)
    may_write_clusters: frozenset[str] | None = None  # the pushing token's reach; None: any
    may_write_nodes: frozenset[str] | None = None
    # (position in gpus, ts, *gpu_workloads values): a GPU's workload where it changes within the batch
    workload_rows: list[tuple] = []  # noqa: RUF012 (a NamedTuple default, never mutated)

    def claimant(self) -> Claimant:
        return Claimant(self.cluster, self.node, self.may_write_clusters, self.may_write_nodes)


class PreparedBatch(NamedTuple):
    samples: int
    touch: dict[str, Any]
    logged: dict[str, Any]
    gpu_rows: list  # flat, as in UnresolvedBatch, with database ids
    nic_rows: list
    xid_rows: list[tuple]
    workload_rows: list[tuple] = []  # noqa: RUF012 (gpu id, ts, *values), changes within the batch
