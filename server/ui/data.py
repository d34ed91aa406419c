"""What the status page reads from storage, read-only, each query keyword-only on a Connection.
The page's own reads (the fleet's newest sample per GPU, one episode, the samples of a peer
group over a window) live here; what the API already has (server/store/queries.py,
episodes.py) is reused as is."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, func, select

from server.peer_groups import nic_group, peer_group
from server.store import episodes as episode_store
from server.store import schema

NodeT, GpuT, NicT = schema.Node.__table__, schema.Gpu.__table__, schema.Nic.__table__
SampleT, NicSampleT = schema.GpuSample.__table__, schema.NicSample.__table__
EpisodeT, EventT = schema.Episode.__table__, schema.EpisodeEvent.__table__

# The newest sample of each GPU, for the grid: what the cells are coloured by.
GRID_COLUMNS = ("ts", "lost", "sm_clock_mhz", "sm_clock_max_mhz", "util_gpu_pct", "clocks_event_reasons", "temp_c", "power_w")
# Columns read for a chart besides its metric's own: busy or idle, and the reason bits.
CONTEXT_COLUMNS = ("ts", "lost", "util_gpu_pct", "clocks_event_reasons")
MAX_PEERS = 32  # peers drawn into the band: the target's node first (the detector's first comparison), then the rest


def nodes(conn: Connection, *, cluster: str | None = None) -> list[dict[str, Any]]:
    stmt = select(NodeT.c.id, NodeT.c.cluster, NodeT.c.name, NodeT.c.labels, NodeT.c.last_seen)
    if cluster is not None:
        stmt = stmt.where(NodeT.c.cluster == cluster)
    return [{"id": r.id, "cluster": r.cluster, "node": r.name, "labels": r.labels or {}, "last_seen": r.last_seen} for r in conn.execute(stmt)]


def grid_gpus(conn: Connection, *, cluster: str | None = None) -> list[dict[str, Any]]:
    """Every GPU (the newest of a replaced slot) with its node and its newest sample (one index
    lookup per GPU on the (gpu_id, ts) key)."""
    newest = select(func.max(SampleT.c.ts)).where(SampleT.c.gpu_id == GpuT.c.id).correlate(GpuT).scalar_subquery()
    stmt = (
        select(GpuT.c.id, GpuT.c.node_id, GpuT.c.index, GpuT.c.uuid, GpuT.c.model, GpuT.c.first_seen, NodeT.c.cluster, NodeT.c.name,
               NodeT.c.labels, *(SampleT.c[c].label(f"s_{c}") for c in GRID_COLUMNS))
        .select_from(GpuT)
        .join(NodeT, NodeT.c.id == GpuT.c.node_id)
        .outerjoin(SampleT, (SampleT.c.gpu_id == GpuT.c.id) & (SampleT.c.ts == newest))
    )
    if cluster is not None:
        stmt = stmt.where(NodeT.c.cluster == cluster)
    slots: dict[tuple[int, int], dict[str, Any]] = {}
    for r in conn.execute(stmt).mappings():
        key = (r["node_id"], r["index"])
        if key in slots and slots[key]["first_seen"] > r["first_seen"]:
            continue  # a replaced GPU's old row: the newest holds the index
        sample = {c: r[f"s_{c}"] for c in GRID_COLUMNS} if r["s_ts"] is not None else None
        slots[key] = {"id": r["id"], "cluster": r["cluster"], "node": r["name"], "labels": r["labels"] or {}, "index": r["index"],
                      "uuid": r["uuid"], "model": r["model"], "first_seen": r["first_seen"], "sample": sample}
    return list(slots.values())


def episode(conn: Connection, *, episode_id: int) -> dict[str, Any] | None:
    row = conn.execute(select(EpisodeT).where(EpisodeT.c.id == episode_id)).mappings().first()
    return None if row is None else {k: row[k] for k in (*episode_store.PUBLIC_FIELDS, "entity")}


def episode_events(conn: Connection, *, episode_id: int) -> list[dict[str, Any]]:
    """The episode's changes the outputs have not pruned yet (collector clock)."""
    stmt = select(EventT.c.change, EventT.c.at, EventT.c.episode).where(EventT.c.episode_id == episode_id).order_by(EventT.c.id)
    return [dict(r) for r in conn.execute(stmt).mappings()]


def node_episodes(conn: Connection, *, cluster: str, node: str, since: float) -> list[dict[str, Any]]:
    """The node's episodes open now or resolved since `since` (sample time), newest first."""
    eps = episode_store.episodes_between(conn, since=since, until=1e300, cluster=cluster)
    return sorted((e for e in eps if e["node"] == node), key=lambda e: -e["onset"])


def node_record(conn: Connection, *, cluster: str, node: str) -> dict[str, Any] | None:
    found = [n for n in nodes(conn, cluster=cluster) if n["node"] == node]
    return found[0] if found else None


def cluster_now(conn: Connection, *, cluster: str) -> float | None:
    return conn.execute(select(func.max(NodeT.c.last_seen)).where(NodeT.c.cluster == cluster)).scalar()


def gpu_peers(conn: Connection, *, ep: dict[str, Any]) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The episode's GPU and its peers (same cluster, model and job/partition label:
    server/peer_groups.py), at most MAX_PEERS of them, those on its own node first."""
    stmt = (select(GpuT.c.id, GpuT.c.uuid, GpuT.c.index, GpuT.c.model, NodeT.c.name, NodeT.c.labels)
            .join(NodeT, NodeT.c.id == GpuT.c.node_id).where(NodeT.c.cluster == ep["cluster"]))
    gpus = [{"id": r.id, "uuid": r.uuid, "index": r.index, "model": r.model, "node": r.name, "labels": r.labels or {}} for r in conn.execute(stmt)]
    target = next((g for g in gpus if ep.get("uuid") and g["uuid"] == ep["uuid"]), None)
    target = target or next((g for g in gpus if g["node"] == ep["node"] and g["index"] == ep.get("gpu")), None)
    if target is None:
        return None, []
    key = peer_group(cluster=ep["cluster"], model=target["model"], labels=target["labels"])
    peers = [g for g in gpus if g["id"] != target["id"] and peer_group(cluster=ep["cluster"], model=g["model"], labels=g["labels"]) == key]
    peers.sort(key=lambda g: (g["node"] != target["node"], g["node"], g["index"]))
    return target, peers[:MAX_PEERS]


def nic_peers(conn: Connection, *, ep: dict[str, Any]) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The episode's port (device and port from its evidence) and its peers: the ports of the
    nodes in its NIC group (same cluster and job/partition label), its own node's first."""
    evidence = ep.get("evidence") or {}
    stmt = (select(NicT.c.id, NicT.c.device, NicT.c.port, NodeT.c.name, NodeT.c.labels)
            .join(NodeT, NodeT.c.id == NicT.c.node_id).where(NodeT.c.cluster == ep["cluster"]))
    ports = [{"id": r.id, "device": r.device, "port": r.port, "node": r.name, "labels": r.labels or {}} for r in conn.execute(stmt)]
    target = next((p for p in ports if p["node"] == ep["node"] and p["device"] == evidence.get("device")
                   and str(p["port"]) == str(evidence.get("port"))), None)
    if target is None:
        return None, []
    key = nic_group(cluster=ep["cluster"], labels=target["labels"])
    peers = [p for p in ports if p["id"] != target["id"] and nic_group(cluster=ep["cluster"], labels=p["labels"]) == key]
    peers.sort(key=lambda p: (p["device"] != target["device"] or p["port"] != target["port"], p["node"] != target["node"], p["node"]))
    return target, peers[:MAX_PEERS]


def samples(conn: Connection, *, ids: Sequence[int], columns: Sequence[str], since: float, until: float,
            nic: bool = False) -> dict[int, list[dict[str, Any]]]:
    """Samples of these GPUs (or ports) in [since, until], per id in time order."""
    table, key = (NicSampleT, "nic_id") if nic else (SampleT, "gpu_id")
    wanted = dict.fromkeys(c for c in ("ts", *((() if nic else CONTEXT_COLUMNS)), *columns) if c in table.c)
    stmt = (select(table.c[key], *(table.c[c] for c in wanted))
            .where(table.c[key].in_(list(ids)), table.c.ts >= since, table.c.ts <= until).order_by(table.c[key], table.c.ts))
    out: dict[int, list[dict[str, Any]]] = {i: [] for i in ids}
    for r in conn.execute(stmt).mappings():
        out[r[key]].append({c: r[c] for c in wanted})
    return out
