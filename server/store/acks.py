"""Operators' acknowledgements of a hardware fault's remedy (server/hints/remedy.py, held.py). Keyword-only
functions over a Connection; the caller owns the transaction."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Connection, insert, select

from server.store import schema

AckT, NodeT = schema.HintAck.__table__, schema.Node.__table__
FIELDS = ("id", "cluster", "node", "gpu", "sample_time", "acked_at", "acked_by", "key_id", "note")


class UnknownNode(LookupError):
    pass


def add_ack(conn: Connection, *, cluster: str, node: str, gpu: int | None, acked_by: str, key_id: str | None = None,
            note: str = "", now: float | None = None) -> dict[str, Any]:
    """Record an ack; it covers the node's faults up to its newest sample time (UnknownNode if
    the collector never heard of the node)."""
    last_seen = conn.execute(select(NodeT.c.last_seen).where(NodeT.c.cluster == cluster, NodeT.c.name == node)).scalar()
    if last_seen is None:
        raise UnknownNode(f"no node {node!r} in cluster {cluster!r}")
    row = {"cluster": cluster, "node": node, "gpu": gpu, "sample_time": float(last_seen),
           "acked_at": time.time() if now is None else now, "acked_by": acked_by, "key_id": key_id, "note": note[:1000]}
    ack_id = conn.execute(insert(AckT).values(**row)).inserted_primary_key[0]
    return {"id": ack_id, **row}


def list_acks(conn: Connection, *, cluster: str | None = None, node: str | None = None) -> list[dict[str, Any]]:
    stmt = select(*(AckT.c[f] for f in FIELDS)).order_by(AckT.c.id)
    if cluster is not None:
        stmt = stmt.where(AckT.c.cluster == cluster)
    if node is not None:
        stmt = stmt.where(AckT.c.node == node)
    return [dict(r) for r in conn.execute(stmt).mappings()]

