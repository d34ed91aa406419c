"""Token administration (scope admin): the same as `laggard token create|list|revoke`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter
from pydantic import BaseModel, Field

from server.auth import store
from server.auth.tokens import SCOPES, parse_scopes
from server.errors import ApiError
from server.protocol import PRINTABLE, PathName
from server.services import EngineDep

router = APIRouter(prefix="/api/v1/tokens", tags=["tokens"])

Scope = Annotated[str, Field(pattern="^(" + "|".join(SCOPES) + ")$")]


class TokenRequest(BaseModel):
    scopes: Annotated[list[Scope], Field(min_length=1, max_length=len(SCOPES))]
    # The names a push carries (server/protocol.py): a binding to a name no push can send binds nothing.
    name: Annotated[str, Field(max_length=253, pattern=PRINTABLE)] = ""
    cluster: PathName | None = None
    nodes: Annotated[list[PathName], Field(min_length=1, max_length=10_000)] | None = None


class TokenOut(BaseModel):
    key_id: str
    name: str
    scopes: list[str]
    cluster: str | None
    nodes: list[str] | None
    created_at: float
    revoked_at: float | None


class CreatedToken(TokenOut):
    token: str = Field(description="The bearer token. Shown once: only its hash is kept.")


@router.get("", summary="Every token (without the secrets)")
def list_tokens(engine: EngineDep) -> dict[str, list[TokenOut]]:
    with engine.connect() as conn:
        return {"tokens": [TokenOut(**vars(t)) for t in store.list_tokens(conn)]}


@router.post("", status_code=201, summary="Create a token; the answer holds it, once", responses={422: {}})
def create_token(engine: EngineDep, body: TokenRequest) -> CreatedToken:
    try:
        with engine.begin() as conn:
            token, info = store.create_token(conn, scopes=parse_scopes(body.scopes), name=body.name, cluster=body.cluster, nodes=body.nodes)
    except ValueError as exc:
        raise ApiError(422, str(exc), loc=["body"], type="invalid") from None
    return CreatedToken(token=token, **vars(info))


@router.delete("/{key_id}", summary="Revoke a token (takes effect within LAGGARD_TOKEN_CACHE_S)", responses={404: {}})
def revoke_token(engine: EngineDep, key_id: str) -> dict[str, str]:
    with engine.begin() as conn:
        if not store.revoke_token(conn, key_id=key_id):
            raise ApiError(404, f"no live token with key id {key_id!r}", loc=["path", "key_id"], type="not_found")
    return {"revoked": key_id}
