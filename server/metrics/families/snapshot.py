"""One scrape's reads of the database, shared by every family collector.

Every query a scrape makes is here, made once on one connection, which is given back before any
family is built; the family collectors then only read this snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import Connection, select, text

from agent.dcgm_fields import dcgm_labels
from server.metrics.families import latest
from server.metrics.families.labels import NO_WORKLOAD, XID_LAST_HORIZON_S
from server.metrics.selection import Selection
from server.store import counters, schema
from server.store.detector_state import backlog as backlog_of
from server.store.detector_state import holder_names

NodeT, EpisodeT = schema.Node.__table__, schema.Episode.__table__

# Label tuples kept between scrapes of one selection: the GPUs' and the ports', by identity.
LabelCache = tuple[dict, dict]


class GpuReading(NamedTuple):
    """A GPU's latest sample with its label tuples: Laggard's (GPU_LABELS) and the DCGM series'
    (FLEET_DCGM_LABELS)."""
    gpu_id: int
    node_id: int
    cluster: str
    hostname: str
    index: int
    model: str | None
    labels: tuple[str, ...]
    dcgm_labels: tuple[str, ...]
    sample: dict[str, Any]


@dataclass
class Snapshot:
    selection: Selection
    now: float
    nodes: dict[int, Any]  # id -> (id, cluster, name, labels, agent, last_seen)
    gpus: list[GpuReading]
    nic_items: list[tuple[tuple[str, ...], dict[str, Any]]]
    active: list[dict[str, Any]]  # open episodes
    last_xid: dict[int, int]  # GPU id -> the code of its latest XID
    xid_last: list[tuple]  # (cluster, node, index, uuid, xid, last ts, GPU id), XIDs of the last XID_LAST_HORIZON_S
    workloads: dict[int, tuple]  # GPU id -> ((namespace, pod, container), job name)
    peer_scopes: dict[int, str]
    progress: dict[str, float]
    backlog: int | None
    holders: dict[int, str] | None  # None: not PostgreSQL, no leases
    pending: dict[str, tuple[int, float]]  # receiver -> (deliveries pending, oldest created_at)
    counters: list[tuple[str, dict[str, str], float]]
    hints: dict[str, Any] | None = None  # the hints document, where the app hands one in and it answered


def read_snapshot(conn: Connection, now: float, sel: Selection, *, max_sample_age_s: float, sql: dict, label_cache: LabelCache) -> Snapshot:
    """`sql`: the latest-sample queries by (kind, only), made once per collector (latest.sql_latest)."""
    nodes = {r[0]: r for r in conn.execute(select(NodeT.c.id, NodeT.c.cluster, NodeT.c.name, NodeT.c.labels, NodeT.c.agent,
                                                  NodeT.c.last_seen)).all()}
    cutoff = now - max_sample_age_s
    workloads, peer_scopes = latest.latest_workloads(conn)
    if sel.whole:
        gpus = latest.fetch_plain(conn, sql[("gpu", None)], cutoff)
        nics = latest.fetch_plain(conn, sql[("nic", None)], cutoff)
    else:
        node_ids = [i for i, n in nodes.items() if sel.takes_node(n[1], n[2])]
        if sel.shards == 1:  # a GPU's peer group is within its cluster: the nodes of the clusters are the GPUs'
            gpus = latest.fetch_plain(conn, sql[("gpu", "node_id")], cutoff, node_ids)
        else:
            gpus = latest.fetch_plain(conn, sql[("gpu", "id")], cutoff, latest.gpu_ids_in(conn, nodes, peer_scopes, sel))
        nics = latest.fetch_plain(conn, sql[("nic", "node_id")], cutoff, node_ids)
    gpu_labels, nic_labels = label_cache
    active = [dict(r) for r in conn.execute(select(
        EpisodeT.c.cluster, EpisodeT.c.node, EpisodeT.c.gpu, EpisodeT.c.uuid, EpisodeT.c.cause, EpisodeT.c.severity, EpisodeT.c.evidence,
    ).where(EpisodeT.c.resolved_at.is_(None))).mappings()]
    last_xid = dict(conn.execute(text(
        "SELECT x.gpu_id, max(x.xid) FROM xid_events x JOIN (SELECT gpu_id, max(ts) AS ts FROM xid_events GROUP BY gpu_id) m "
        "ON m.gpu_id = x.gpu_id AND m.ts = x.ts GROUP BY x.gpu_id")).all())
    xid_last = conn.execute(text(
        'SELECT n.cluster, n.name, g."index", g.uuid, x.xid, max(x.ts), g.id FROM xid_events x JOIN gpus g ON g.id = x.gpu_id '
        "JOIN nodes n ON n.id = g.node_id WHERE x.ts >= :since GROUP BY n.cluster, n.name, g.\"index\", g.uuid, x.xid, g.id"),
        {"since": now - XID_LAST_HORIZON_S}).all()
    progress = dict(conn.execute(text("SELECT key, value FROM detector_progress")).all())
    backlog = backlog_of(conn, progress)
    holders = holder_names(conn) if conn.dialect.name == "postgresql" else None
    pending = {r[0]: (r[1], r[2]) for r in conn.execute(text(
        "SELECT receiver, count(*), min(created_at) FROM alert_deliveries WHERE state = 'pending' GROUP BY receiver")).all()}
    return Snapshot(
        selection=sel, now=now, nodes=nodes, gpus=_gpu_readings(gpus, nodes, workloads, gpu_labels),
        nic_items=_nic_items(nics, nodes, nic_labels), active=active, last_xid=last_xid, xid_last=xid_last, workloads=workloads,
        peer_scopes=peer_scopes, progress=progress, backlog=backlog, holders=holders, pending=pending, counters=counters.read_all(conn),
    )


def _gpu_readings(rows: list[tuple], nodes: dict[int, Any], workloads: dict[int, tuple], cache: dict) -> list[GpuReading]:
    """Each GPU row of a known node, with the same label tuples from scrape to scrape: the renderer
    then finds its cached line heads by identity (agent/exposition.py Renderer)."""
    out = []
    fresh: dict[tuple, tuple[tuple[str, ...], tuple[str, ...]]] = {}
    for row in rows:
        node = nodes.get(row[1])
        if node is None:
            continue
        cluster, hostname, driver = node[1], node[2], _driver_version(node[4])
        index, uuid, model, pci_bus_id = row[2], row[3], row[4], row[5]
        sample = dict(zip(latest.GPU_COLUMNS, row[6:]))
        pod, job = workloads.get(row[0], NO_WORKLOAD)
        ident = (row[0], cluster, hostname, index, uuid, model, pci_bus_id, driver, pod, job)
        labels, dlabels = fresh[ident] = cache.get(ident) or (
            (cluster, hostname, str(index), uuid, job),
            # As if the node's own exporter served them: instance = the node, and the pod using
            # the GPU (FLEET_DCGM_LABELS).
            (*dcgm_labels(index=index, uuid=uuid, model=model, hostname=hostname, cluster=cluster, pci_bus_id=pci_bus_id,
                          driver=driver), hostname, *(v or "" for v in pod)))
        out.append(GpuReading(row[0], row[1], cluster, hostname, index, model, labels, dlabels, sample))
    cache.clear()
    cache.update(fresh)
    return out


def _nic_items(rows: list[tuple], nodes: dict[int, Any], cache: dict) -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    """Each port of a known node: its label tuple (kept between scrapes, as the GPUs') and sample."""
    items = []
    fresh: dict[tuple, tuple[str, ...]] = {}
    for row in rows:
        node = nodes.get(row[1])
        if node is not None:
            ident = (row[0], node[1], node[2], row[2], row[3])
            labels = fresh[ident] = cache.get(ident) or (node[1], node[2], row[2], str(row[3]))
            items.append((labels, dict(zip(latest.NIC_COLUMNS, row[4:]))))
    cache.clear()
    cache.update(fresh)
    return items


def _driver_version(agent: Any) -> str | None:
    """The driver version in a node's stored agent info (the `agent` object of its latest batch,
    docs/protocol.md), None where the agent did not say."""
    driver = agent.get("driver") if isinstance(agent, dict) else None
    return driver if isinstance(driver, str) else None
