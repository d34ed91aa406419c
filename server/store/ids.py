"""Node, GPU and NIC ids for incoming samples: looked up once, then served from memory.

New entries are staged per transaction and only published after commit, so a rolled-back
transaction never leaves the cache pointing at rows that do not exist.

A GPU is known by its UUID and lives on one node. A batch may claim a known GPU for its own node
(a GPU that moved) only when the pusher may write for the node the GPU is on now and that node
has stopped reporting it; otherwise the claim is a conflict (GpuClaimConflict), raised before
the batch writes anything, so that no push can move, overwrite or hide another node's GPU."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sqlalchemy import Connection, func, select, update

from server.store import schema
from server.store.dialect import insert_ignore


class GpuIdentity(NamedTuple):
    id: int
    node_id: int
    index: int
    model: str | None
    pci_bus_id: str | None


@dataclass
class IdCache:
    nodes: dict[tuple[str, str], int] = field(default_factory=dict)
    node_keys: dict[int, tuple[str, str]] = field(default_factory=dict)  # id -> (cluster, name)
    gpus: dict[str, GpuIdentity] = field(default_factory=dict)
    nics: dict[tuple[int, str, int], int] = field(default_factory=dict)

    def merge(self, staged: "IdCache") -> None:
        self.nodes.update(staged.nodes)
        self.node_keys.update(staged.node_keys)
        self.gpus.update(staged.gpus)
        self.nics.update(staged.nics)


@dataclass(frozen=True)
class Claimant:
    """Who pushes a batch: its node, and the nodes its token may write (None: any)."""

    cluster: str
    node: str
    clusters: frozenset[str] | None = None
    nodes: frozenset[str] | None = None

    def may_write(self, cluster: str, node: str) -> bool:
        return (self.clusters is None or cluster in self.clusters) and (self.nodes is None or node in self.nodes)


class GpuClaimConflict(Exception):
    """A batch claims a GPU that another node holds and may not be taken from it."""

    def __init__(self, *, uuid: str, cluster: str, claimant: str, holder: tuple[str, str] | None, last_reported: float | None):
        self.uuid, self.cluster, self.claimant, self.holder, self.last_reported = uuid, cluster, claimant, holder, last_reported
        super().__init__(self.message())

    def fields(self) -> dict:
        return {"uuid": self.uuid, "cluster": self.cluster, "claimant": self.claimant, "holder": self.holder, "last_reported": self.last_reported}

    def message(self) -> str:
        if self.holder is None:  # another cluster's: its names are not this token's to read
            return f"GPU {self.uuid} belongs to a node of another cluster; node {self.claimant!r} may not report it"
        holder = f"node {self.holder[1]!r}"
        if self.last_reported is None:
            why = f"this token may not write for {holder}"
        else:
            why = f"{holder} still reports it (last sample at {self.last_reported:.3f})"
        return f"GPU {self.uuid} is on {holder} of cluster {self.cluster!r}, also claimed by node {self.claimant!r}: {why}"


class CacheMiss(LookupError):
    """An offline resolver met a node, GPU or NIC it has no id for."""


class IdResolver:
    """Resolves ids inside one transaction, reading through `published` and writing to `staged`.
    Without a connection it is offline: known ids only, CacheMiss for anything new."""

    def __init__(self, conn: Connection | None, published: IdCache, *, move_after_s: float = 300.0):
        self.conn = conn
        self.published = published
        self.staged = IdCache()
        self.move_after_s = move_after_s

    def node_id(self, *, cluster: str, name: str, seen: float) -> int:
        key = (cluster, name)
        found = self.staged.nodes.get(key) or self.published.nodes.get(key)
        if found is not None:
            return found
        self._insert_ignore(schema.Node, cluster=cluster, name=name, labels={}, agent=None, first_seen=seen, last_seen=seen)
        node_id = self.conn.execute(
            select(schema.Node.id).where(schema.Node.cluster == cluster, schema.Node.name == name)
        ).scalar_one()
        self.staged.nodes[key] = node_id
        self.staged.node_keys[node_id] = key
        return node_id

    def refuse_conflicting_claims(self, claimant: Claimant, gpus: list[tuple]) -> None:
        """Raise GpuClaimConflict if any of a batch's GPUs (uuid, ..., first ts) is held by
        another node that keeps it; reads only, so a refused batch has written nothing."""
        for uuid, *_, seen in gpus:
            known = self._known_gpu(uuid)
            if known is None:
                continue
            holder = self._node_key(known.node_id)
            if holder == (claimant.cluster, claimant.node):
                continue
            if self.conn is None:
                raise CacheMiss("gpus")  # a move or a conflict: decided in the transaction
            if not claimant.may_write(*holder):
                visible = holder if holder[0] == claimant.cluster else None
                raise GpuClaimConflict(uuid=uuid, cluster=claimant.cluster, claimant=claimant.node, holder=visible, last_reported=None)
            last = self._last_reported(uuid, known, since=seen - self.move_after_s)
            if last is not None:
                raise GpuClaimConflict(uuid=uuid, cluster=claimant.cluster, claimant=claimant.node, holder=holder, last_reported=last)

    def _known_gpu(self, uuid: str) -> GpuIdentity | None:
        known = self.staged.gpus.get(uuid) or self.published.gpus.get(uuid)
        if known is not None or self.conn is None:
            return known
        row = self.conn.execute(
            select(schema.Gpu.id, schema.Gpu.node_id, schema.Gpu.index, schema.Gpu.model, schema.Gpu.pci_bus_id).where(schema.Gpu.uuid == uuid)
        ).one_or_none()
        return None if row is None else GpuIdentity(*row)

    def _node_key(self, node_id: int) -> tuple[str, str]:
        key = self.staged.node_keys.get(node_id) or self.published.node_keys.get(node_id)
        if key is not None:
            return key
        if self.conn is None:
            raise CacheMiss("nodes")
        cluster, name = self.conn.execute(select(schema.Node.cluster, schema.Node.name).where(schema.Node.id == node_id)).one()
        self.staged.node_keys[node_id] = (cluster, name)
        return cluster, name

    def _last_reported(self, uuid: str, known: GpuIdentity, *, since: float) -> float | None:
        """The newest sample time of the GPU at or after `since`, None if it has none there."""
        if uuid in self.staged.gpus:
            return since + self.move_after_s  # claimed by another batch of this transaction: reporting now
        return self.conn.execute(
            select(func.max(schema.GpuSample.ts)).where(schema.GpuSample.gpu_id == known.id, schema.GpuSample.ts >= since)
        ).scalar_one_or_none()

    def gpu_id(self, *, node_id: int, uuid: str, index: int, model: str | None, pci_bus_id: str | None, seen: float) -> int:
        known = self.staged.gpus.get(uuid) or self.published.gpus.get(uuid)
        if known is not None and known[1:] == (node_id, index, model, pci_bus_id):
            return known.id
        if self.conn is None:  # new, or moved: either way a write, left to the transaction
            raise CacheMiss("gpus")
        if known is None:
            self._insert_ignore(schema.Gpu, uuid=uuid, node_id=node_id, index=index, model=model, pci_bus_id=pci_bus_id, first_seen=seen)
            row = self.conn.execute(
                select(schema.Gpu.id, schema.Gpu.node_id, schema.Gpu.index, schema.Gpu.model, schema.Gpu.pci_bus_id).where(schema.Gpu.uuid == uuid)
            ).one()
            known = GpuIdentity(*row)
            if known.node_id != node_id:
                self._raise_lost_race(uuid, known, node_id, seen)
        wanted = GpuIdentity(known.id, node_id, index, model, pci_bus_id)
        if known != wanted:
            # The GPU moved (another node or slot) or the agent learnt its model: keep the latest.
            self.conn.execute(
                update(schema.Gpu).where(schema.Gpu.id == known.id).values(node_id=node_id, index=index, model=model, pci_bus_id=pci_bus_id)
            )
        self.staged.gpus[uuid] = wanted
        return known.id

    def _raise_lost_race(self, uuid: str, known: GpuIdentity, node_id: int, seen: float) -> None:
        """Another writer registered the GPU for another node after this batch's claims were
        checked. Raised after this batch's first writes: its transaction must not commit."""
        cluster, claimant = self._node_key(node_id)
        holder = self._node_key(known.node_id)
        raise GpuClaimConflict(uuid=uuid, cluster=cluster, claimant=claimant, holder=holder if holder[0] == cluster else None, last_reported=seen)

    def nic_id(self, *, node_id: int, device: str, port: int, seen: float) -> int:
        key = (node_id, device, port)
        found = self.staged.nics.get(key) or self.published.nics.get(key)
        if found is not None:
            return found
        self._insert_ignore(schema.Nic, node_id=node_id, device=device, port=port, first_seen=seen)
        nic_id = self.conn.execute(
            select(schema.Nic.id).where(schema.Nic.node_id == node_id, schema.Nic.device == device, schema.Nic.port == port)
        ).scalar_one()
        self.staged.nics[key] = nic_id
        return nic_id

    def _insert_ignore(self, orm_class: type[schema.Base], /, **values: Any) -> None:
        if self.conn is None:
            raise CacheMiss(orm_class.__tablename__)
        self.conn.execute(insert_ignore(self.conn.dialect.name, orm_class.__table__).values(**values))
