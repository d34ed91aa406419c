"""Hardware faults still waiting for their remedy, as stored: what retention must keep (a fault
forgotten would put its GPU back in service, server/hints/remedy.py), and acks as the rules read them."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, select

from server.hints.remedy import Ack, covering_ack, remedy_for
from server.store import acks as ack_store
from server.store import episodes, schema

NodeT = schema.Node.__table__


def as_ack(row: dict[str, Any]) -> Ack:
    return Ack(cluster=row["cluster"], node=row["node"], gpu=row["gpu"], sample_time=row["sample_time"],
               acked_at=row["acked_at"], acked_by=row["acked_by"], note=row["note"] or "")


def held_fault_ids(conn: Connection, cutoff: float) -> list[int]:
    """Episodes resolved before `cutoff` whose remedy no ack covers and whose node has not booted
    since. (A GPU that came back from that reboot lost, missing or with rows pending remap has
    episodes of its own by then.)"""
    old = episodes.resolved_before(conn, before=cutoff, causes=("xid", "ecc"))
    if not old:
        return []
    known = [as_ack(r) for r in ack_store.list_acks(conn)]
    boots = {(c, n): (a or {}).get("boot_time") if isinstance(a, dict) else None
             for c, n, a in conn.execute(select(NodeT.c.cluster, NodeT.c.name, NodeT.c.agent))}
    return [e["id"] for e in old if remedy_for(e) is not None and covering_ack(e, known) is None
            and not _booted_since(boots.get((e["cluster"], e["node"])), e["onset"])]


def _booted_since(boot_time, onset: float) -> bool:
    return isinstance(boot_time, (int, float)) and not isinstance(boot_time, bool) and boot_time > onset
