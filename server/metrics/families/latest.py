"""The scrape's shared reads of the inventory: each GPU's and port's latest sample (all of them, or
a slice's), and each GPU's latest workload."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Connection, text

from agent.dcgm_fields import dcgm_inputs
from server.metrics.families.labels import NO_POD
from server.metrics.selection import Selection
from server.peer_groups import peer_group, workload_job, workload_key
from server.store import schema
from server.store.driver_rows import driver_rows

GpuSampleT, NicSampleT = schema.GpuSample.__table__, schema.NicSample.__table__

# The columns a scrape reads (fewer columns, faster at 10,000 GPUs): what the DCGM fields are made
# of (dcgm_inputs), and what Laggard's own per-GPU series need.
GPU_COLUMNS = [c.name for c in GpuSampleT.columns if c.name in {
    "ts", "lost", *dcgm_inputs(), "sm_clock_mhz", "sm_clock_max_mhz", "util_gpu_pct", "clocks_event_reasons", "nvlink_links_up",
    "nvlink_links_total", "nvlink_crc_errors_total",
}]
NIC_COLUMNS = [c.name for c in NicSampleT.columns if c.name != "nic_id"]


def sql_latest(dialect: str, kind: str, only: str | None = None) -> str:
    """Each GPU's (or port's) latest sample, one index probe per series on the primary key.
    `only`: "id" or "node_id", to read only the GPUs or ports (or those of the nodes) in the
    list bound to :ids, for a scrape that carries a slice of the fleet."""
    if kind == "gpu":
        inv, samples, key, cols, ident = "gpus", "gpu_samples", "gpu_id", GPU_COLUMNS, 'i.id, i.node_id, i."index", i.uuid, i.model, i.pci_bus_id'
    else:
        inv, samples, key, cols, ident = "nics", "nic_samples", "nic_id", NIC_COLUMNS, "i.id, i.node_id, i.device, i.port"
    picked = ", ".join(f's."{c}"' for c in cols)
    if dialect == "postgresql":
        inner = ", ".join(f'm."{c}"' for c in cols)
        where = "" if only is None else f" AND i.{only} = ANY(:ids)"
        return (f"SELECT {ident}, {picked} FROM {inv} i CROSS JOIN LATERAL "
                f"(SELECT {inner} FROM {samples} m WHERE m.{key} = i.id ORDER BY m.ts DESC LIMIT 1) s WHERE s.ts >= :cutoff{where}")
    # SQLite: CROSS JOIN keeps the inventory as the outer loop; max() on the (id, ts) key is one seek.
    where = "" if only is None else f" AND i.{only} IN (SELECT value FROM json_each(:ids))"
    return (f"SELECT {ident}, {picked} FROM {inv} i CROSS JOIN {samples} s ON s.{key} = i.id "
            f"AND s.ts = (SELECT max(m.ts) FROM {samples} m WHERE m.{key} = i.id) WHERE s.ts >= :cutoff{where}")


def fetch_plain(conn: Connection, sql: str, cutoff: float, ids: list[int] | None = None) -> list[tuple]:
    """Rows as the driver's plain tuples: at 10,000 GPUs, SQLAlchemy's Row objects cost more than
    the query. (Booleans stay 0/1 on SQLite, which every reader here treats alike.) `ids`: the
    list a sliced query binds to :ids (an array on PostgreSQL, JSON for SQLite's json_each)."""
    params: dict[str, Any] = {"cutoff": cutoff}
    if conn.dialect.name == "postgresql":
        sql = sql.replace(":cutoff", "%(cutoff)s").replace(":ids", "%(ids)s")
        params["ids"] = ids
    else:
        params["ids"] = json.dumps(ids)
    return driver_rows(conn, sql, params)


def gpu_ids_in(conn: Connection, nodes: dict[int, Any], peer_scopes: dict[int, str], sel: Selection) -> list[int]:
    """The GPUs whose series live in a sharded slice: those whose peer group falls in its shard
    (server/metrics/selection.py), worked out once per node, model and workload."""
    takes: dict[tuple[int, str | None, str | None], bool] = {}
    out = []
    for gpu_id, node_id, model in conn.execute(text("SELECT id, node_id, model FROM gpus")):
        node = nodes.get(node_id)
        if node is None or not sel.takes_cluster(node[1]):
            continue
        key = (node_id, model, peer_scopes.get(gpu_id))
        if key not in takes:
            group = peer_group(cluster=node[1], model=model, labels=node[3] or {}, workload=key[2])
            takes[key] = sel.takes_peer_group(node[1], group)
        if takes[key]:
            out.append(gpu_id)
    return out


def latest_workloads(conn: Connection) -> tuple[dict[int, tuple], dict[int, str]]:
    """Each GPU's latest workload (gpu_workloads holds changes), by GPU id: the pod's labels for
    the DCGM series and the job's name (as the API's ?job= filter names it) for Laggard's own;
    and, apart, its peer-group scope (workload_key) for GPUs a job is attributed to."""
    workloads: dict[int, tuple] = {}
    peer_scopes: dict[int, str] = {}
    for gpu_id, kind, namespace, pod, container, job, slurm_job_id in conn.execute(text(
            "SELECT w.gpu_id, w.kind, w.namespace, w.pod, w.container, w.job, w.slurm_job_id FROM gpu_workloads w "
            "JOIN (SELECT gpu_id, max(ts) AS ts FROM gpu_workloads GROUP BY gpu_id) m ON m.gpu_id = w.gpu_id AND m.ts = w.ts")):
        job_name = workload_job(kind, job=job, pod=pod, slurm_job_id=slurm_job_id) or ""
        pod_labels = (namespace, pod, container) if kind == "k8s" else NO_POD
        if job_name or pod_labels != NO_POD:
            workloads[gpu_id] = (pod_labels, job_name)
        scope = workload_key(kind, namespace=namespace, job=job, pod=pod, slurm_job_id=slurm_job_id)
        if scope is not None:
            peer_scopes[gpu_id] = scope
    return workloads, peer_scopes
