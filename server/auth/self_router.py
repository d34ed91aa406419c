"""GET /api/v1/tokens/self: what the presented token may do, for the token's own holder (any
scope). An agent started without --cluster asks it which cluster to push for."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel

router = APIRouter(prefix="/api/v1/tokens", tags=["tokens"])


class TokenSelf(BaseModel):
    key_id: str
    name: str
    scopes: list[str]
    cluster: str | None
    nodes: list[str] | None


@router.get("/self", summary="The presented token's scopes and the cluster and nodes it is bound to")
def token_self(request: Request) -> TokenSelf:
    p = request.state.principal
    return TokenSelf(key_id=p.key_id, name=p.name, scopes=sorted(p.scopes), cluster=p.cluster,
                     nodes=sorted(p.nodes) if p.nodes is not None else None)
