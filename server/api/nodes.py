"""Nodes and what they last reported."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from server.api.deps import ConnDep
from server.errors import ApiError
from server.store import queries

router = APIRouter(prefix="/api/v1/nodes", tags=["nodes"])


@router.get("", summary="All nodes that have reported")
def list_nodes(conn: ConnDep, cluster: str | None = None) -> dict[str, Any]:
    return {"nodes": [_public(n) for n in queries.list_nodes(conn, cluster=cluster)]}


@router.get("/{node}", summary="One node, its GPUs and NICs with their latest sample", responses={404: {}, 409: {}})
def get_node(node: str, conn: ConnDep, cluster: str | None = None) -> dict[str, Any]:
    found = queries.find_nodes(conn, name=node, cluster=cluster)
    if not found:
        where = f" in cluster {cluster!r}" if cluster else ""
        raise ApiError(404, f"unknown node {node!r}{where}", loc=["path", "node"], type="not_found")
    if len(found) > 1:
        clusters = sorted(n["cluster"] for n in found)
        raise ApiError(409, f"node {node!r} exists in clusters {clusters}: add ?cluster=", loc=["query", "cluster"], type="ambiguous")
    record = found[0]
    return _public(record) | {
        "gpus": queries.node_gpus_latest(conn, node_id=record["id"]),
        "nics": queries.node_nics_latest(conn, node_id=record["id"]),
    }


def _public(node: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in node.items() if k != "id"}
