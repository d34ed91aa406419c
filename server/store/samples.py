"""Writing one validated Batch inside a transaction: ids, then the rows in bulk."""

from __future__ import annotations

from operator import attrgetter

from sqlalchemy import Connection, func, update

from server.protocol import GPU_METRICS, NIC_METRICS, Batch
from server.store import schema
from server.store.dialect import positional_insert_ignore_sql
from server.store.ids import IdResolver

_gpu_metrics = attrgetter(*GPU_METRICS)
_nic_metrics = attrgetter(*NIC_METRICS)


class SampleWriter:
    """Holds the per-dialect insert SQL; write() is called once per batch inside a transaction."""

    def __init__(self, dialect_name: str):
        self.dialect_name = dialect_name
        self.gpu_sql = positional_insert_ignore_sql(dialect_name, schema.GpuSample.__table__)
        self.nic_sql = positional_insert_ignore_sql(dialect_name, schema.NicSample.__table__)
        self.xid_sql = positional_insert_ignore_sql(dialect_name, _xid_table_without_id())

    def write(self, conn: Connection, ids: IdResolver, batch: Batch) -> int:
        if not batch.samples:
            return 0
        first_ts = min(s.ts for s in batch.samples)
        last_ts = max(s.ts for s in batch.samples)
        node_id = ids.node_id(cluster=batch.cluster, name=batch.node, seen=first_ts)
        gpu_rows, nic_rows, xid_rows = [], [], []
        for sample in batch.samples:
            ts = sample.ts
            for gpu in sample.gpus:
                gpu_id = ids.gpu_id(node_id=node_id, uuid=gpu.uuid, index=gpu.index, model=gpu.model, pci_bus_id=gpu.pci_bus_id, seen=ts)
                gpu_rows.append((gpu_id, ts, *_gpu_metrics(gpu)))
                xid_rows.extend((gpu_id, x.xid, x.ts) for x in gpu.xids)
            for nic in sample.nics:
                nic_id = ids.nic_id(node_id=node_id, device=nic.device, port=nic.port, seen=ts)
                nic_rows.append((nic_id, ts, *_nic_metrics(nic)))
        if gpu_rows:
            conn.exec_driver_sql(self.gpu_sql, gpu_rows)
        if nic_rows:
            conn.exec_driver_sql(self.nic_sql, nic_rows)
        if xid_rows:
            conn.exec_driver_sql(self.xid_sql, xid_rows)
        conn.execute(
            update(schema.Node)
            .where(schema.Node.id == node_id)
            .values(
                last_seen=func.max(schema.Node.last_seen, last_ts) if self.dialect_name == "sqlite" else func.greatest(schema.Node.last_seen, last_ts),
                labels=dict(batch.labels),
                agent=batch.agent.model_dump() if batch.agent else None,
            )
        )
        return len(batch.samples)


def _xid_table_without_id():
    # The id is assigned by the database; the insert names only the natural key.
    from sqlalchemy import Column, Float, Integer, MetaData, Table

    return Table("xid_events", MetaData(), Column("gpu_id", Integer), Column("xid", Integer), Column("ts", Float))
