"""Node, GPU and NIC ids for incoming samples: looked up once, then served from memory.

New entries are staged per transaction and only published after commit, so a rolled-back
transaction never leaves the cache pointing at rows that do not exist."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sqlalchemy import Connection, select, update

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
    gpus: dict[str, GpuIdentity] = field(default_factory=dict)
    nics: dict[tuple[int, str, int], int] = field(default_factory=dict)

    def merge(self, staged: "IdCache") -> None:
        self.nodes.update(staged.nodes)
        self.gpus.update(staged.gpus)
        self.nics.update(staged.nics)


class CacheMiss(LookupError):
    """An offline resolver met a node, GPU or NIC it has no id for."""


class IdResolver:
    """Resolves ids inside one transaction, reading through `published` and writing to `staged`.
    Without a connection it is offline: known ids only, CacheMiss for anything new."""

    def __init__(self, conn: Connection | None, published: IdCache):
        self.conn = conn
        self.published = published
        self.staged = IdCache()

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
        return node_id

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
        wanted = GpuIdentity(known.id, node_id, index, model, pci_bus_id)
        if known != wanted:
            # The GPU moved (another node or slot) or the agent learnt its model: keep the latest.
            self.conn.execute(
                update(schema.Gpu).where(schema.Gpu.id == known.id).values(node_id=node_id, index=index, model=model, pci_bus_id=pci_bus_id)
            )
        self.staged.gpus[uuid] = wanted
        return known.id

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
