"""Acknowledgements (scope admin): an operator's word that the remedy of a hardware fault happened
(GPU reset, reboot, field check), so its node's hint may clear (server/hints/remedy.py). Each
one is kept with who (the token's name) and when; `laggard ack` calls POST."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from server.errors import ApiError
from server.hints.router import HintsCacheDep
from server.protocol import DEFAULT_CLUSTER
from server.services import EngineDep
from server.store import acks as ack_store

router = APIRouter(prefix="/api/v1/acks", tags=["hints"])
# Names as ingest stores them; no control characters (PostgreSQL refuses NUL in text).
Name = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[^\x00-\x1f\x7f]+$")]


class AckRequest(BaseModel):
    node: Name
    cluster: Name = DEFAULT_CLUSTER
    gpu: Annotated[int, Field(ge=0, le=1023)] | None = Field(None, description="One GPU of the node; none: every fault of the node")
    note: Annotated[str, Field(max_length=1000, pattern=r"^[^\x00]*$")] = ""


@router.post("", status_code=201, summary="Acknowledge that a node's (or GPU's) hardware fault was remedied",
             responses={404: {}, 422: {}})
def acknowledge(request: Request, body: AckRequest, engine: EngineDep, cache: HintsCacheDep) -> dict[str, Any]:
    principal = request.state.principal
    try:
        with engine.begin() as conn:
            row = ack_store.add_ack(conn, cluster=body.cluster, node=body.node, gpu=body.gpu, note=body.note,
                                    acked_by=principal.name or principal.key_id or "unknown", key_id=principal.key_id or None)
    except ack_store.UnknownNode as exc:
        raise ApiError(404, str(exc), loc=["body", "node"], type="not_found") from None
    cache.invalidate()  # this replica's next answer already sees it
    return row


@router.get("", summary="The acknowledgements recorded, oldest first")
def list_acks(engine: EngineDep, cluster: Name | None = None, node: Name | None = None) -> dict[str, list[dict[str, Any]]]:
    with engine.connect() as conn:
        return {"acks": ack_store.list_acks(conn, cluster=cluster, node=node)}
