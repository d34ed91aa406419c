"""Read-side queries for the API. Keyword-only, each takes a Connection."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, func, select

from server.store import schema, workloads

NodeT = schema.Node.__table__
GpuT = schema.Gpu.__table__
GpuSampleT = schema.GpuSample.__table__
NicSampleT = schema.NicSample.__table__


def list_nodes(conn: Connection, *, cluster: str | None = None) -> list[dict[str, Any]]:
    gpu_count = select(func.count()).where(GpuT.c.node_id == NodeT.c.id).correlate(NodeT).scalar_subquery()
    stmt = select(NodeT, gpu_count.label("gpu_count")).order_by(NodeT.c.cluster, NodeT.c.name)
    if cluster is not None:
        stmt = stmt.where(NodeT.c.cluster == cluster)
    return [_node_dict(row) | {"gpu_count": row["gpu_count"]} for row in conn.execute(stmt).mappings()]


def find_nodes(conn: Connection, *, name: str, cluster: str | None = None) -> list[dict[str, Any]]:
    stmt = select(NodeT).where(NodeT.c.name == name)
    if cluster is not None:
        stmt = stmt.where(NodeT.c.cluster == cluster)
    return [_node_dict(row) for row in conn.execute(stmt).mappings()]


def node_gpus_latest(conn: Connection, *, node_id: int) -> list[dict[str, Any]]:
    latest = (
        select(GpuSampleT.c.gpu_id, func.max(GpuSampleT.c.ts).label("ts"))
        .join(schema.Gpu.__table__, schema.Gpu.id == GpuSampleT.c.gpu_id)
        .where(schema.Gpu.node_id == node_id)
        .group_by(GpuSampleT.c.gpu_id)
        .subquery()
    )
    stmt = (
        select(schema.Gpu.__table__, GpuSampleT)
        .select_from(schema.Gpu.__table__)
        .outerjoin(latest, latest.c.gpu_id == schema.Gpu.id)
        .outerjoin(GpuSampleT, (GpuSampleT.c.gpu_id == latest.c.gpu_id) & (GpuSampleT.c.ts == latest.c.ts))
        .where(schema.Gpu.node_id == node_id)
        .order_by(schema.Gpu.index)
    )
    out, ids, first_seen = [], [], []
    for row in conn.execute(stmt).mappings():
        metrics = {c.name: row[GpuSampleT.c[c.name]] for c in GpuSampleT.columns if c.name != "gpu_id"}
        ids.append(row[GpuT.c.id])
        first_seen.append(row[GpuT.c.first_seen])
        out.append(
            {
                "index": row[schema.Gpu.__table__.c.index],
                "uuid": row[schema.Gpu.__table__.c.uuid],
                "model": row[schema.Gpu.__table__.c.model],
                "pci_bus_id": row[schema.Gpu.__table__.c.pci_bus_id],
                "latest": metrics if metrics["ts"] is not None else None,
            }
        )
    kept = _not_replaced(out, first_seen)
    out, ids = [out[i] for i in kept], [ids[i] for i in kept]
    # What uses each GPU now (issue #15): null when unknown; kind null when idle.
    now = workloads.current(conn, ids)
    for gpu, gpu_id in zip(out, ids):
        gpu["workload"] = now.get(gpu_id)
    return out


def _not_replaced(gpus: list[dict[str, Any]], first_seen: list[float]) -> list[int]:
    """Positions of the GPUs to show: not one whose slot (index) a GPU first seen after its last
    sample holds (replaced while the node was down, as the detector judges it). A GPU that
    vanished stays: the GPUs NVML renumbered after it were seen before it went."""
    def last(i: int) -> float:
        latest = gpus[i]["latest"]
        return latest["ts"] if latest is not None else first_seen[i]

    return [i for i, gpu in enumerate(gpus)
            if not any(j != i and other["index"] == gpu["index"] and first_seen[j] > last(i) for j, other in enumerate(gpus))]


def node_nics_latest(conn: Connection, *, node_id: int) -> list[dict[str, Any]]:
    latest = (
        select(NicSampleT.c.nic_id, func.max(NicSampleT.c.ts).label("ts"))
        .join(schema.Nic.__table__, schema.Nic.id == NicSampleT.c.nic_id)
        .where(schema.Nic.node_id == node_id)
        .group_by(NicSampleT.c.nic_id)
        .subquery()
    )
    stmt = (
        select(schema.Nic.__table__, NicSampleT)
        .select_from(schema.Nic.__table__)
        .outerjoin(latest, latest.c.nic_id == schema.Nic.id)
        .outerjoin(NicSampleT, (NicSampleT.c.nic_id == latest.c.nic_id) & (NicSampleT.c.ts == latest.c.ts))
        .where(schema.Nic.node_id == node_id)
        .order_by(schema.Nic.device, schema.Nic.port)
    )
    out = []
    for row in conn.execute(stmt).mappings():
        metrics = {c.name: row[NicSampleT.c[c.name]] for c in NicSampleT.columns if c.name != "nic_id"}
        out.append(
            {
                "device": row[schema.Nic.__table__.c.device],
                "port": row[schema.Nic.__table__.c.port],
                "latest": metrics if metrics["ts"] is not None else None,
            }
        )
    return out


def gpu_by_uuid(conn: Connection, *, uuid: str) -> dict[str, Any] | None:
    row = conn.execute(
        select(GpuT.c.id, GpuT.c.uuid, GpuT.c.index, GpuT.c.model, NodeT.c.name.label("node"), NodeT.c.cluster)
        .join(NodeT, NodeT.c.id == GpuT.c.node_id)
        .where(GpuT.c.uuid == uuid)
    ).mappings().first()
    return dict(row) if row is not None else None


def oldest_gpu_sample_ts(conn: Connection, *, gpu_id: int) -> float | None:
    return conn.execute(select(func.min(GpuSampleT.c.ts)).where(GpuSampleT.c.gpu_id == gpu_id)).scalar()


def gpu_series(conn: Connection, *, gpu_id: int, metric: str, since: float, until: float, limit: int) -> list[tuple[float, Any]]:
    column = GpuSampleT.c[metric]
    stmt = (
        select(GpuSampleT.c.ts, column)
        .where(GpuSampleT.c.gpu_id == gpu_id, GpuSampleT.c.ts >= since, GpuSampleT.c.ts <= until)
        .order_by(GpuSampleT.c.ts)
        .limit(limit)
    )
    return [(ts, value) for ts, value in conn.execute(stmt).all()]


def _node_dict(row) -> dict[str, Any]:
    return {
        "id": row["id"],
        "cluster": row["cluster"],
        "node": row["name"],
        "labels": row["labels"] or {},
        "agent": row["agent"],
        "first_seen": row["first_seen"],
        "last_seen": row["last_seen"],
    }
