"""API tokens in the database. Keyword-only functions over a Connection; the caller owns the
transaction."""

from __future__ import annotations

import dataclasses
import time

from sqlalchemy import Connection, insert, select, update

from server.auth.tokens import (
    AGENT,
    Principal,
    hash_matches,
    key_id_of,
    new_token,
    token_hash,
)
from server.store import schema

TokenT = schema.ApiToken.__table__


@dataclasses.dataclass(frozen=True)
class TokenInfo:
    key_id: str
    name: str
    scopes: list[str]
    cluster: str | None
    nodes: list[str] | None
    created_at: float
    revoked_at: float | None


def create_token(conn: Connection, *, scopes: frozenset[str], name: str = "", cluster: str | None = None,
                 nodes: list[str] | None = None, now: float | None = None) -> tuple[str, TokenInfo]:
    """(the token, shown once; what was stored)."""
    if AGENT in scopes and cluster is None:
        raise ValueError("an agent token is bound to one cluster: give its cluster")
    if nodes is not None and AGENT not in scopes:
        raise ValueError("nodes restrict where an agent token may push: only for the agent scope")
    token, key_id = new_token()
    info = TokenInfo(key_id=key_id, name=name, scopes=sorted(scopes), cluster=cluster,
                     nodes=sorted(set(nodes)) if nodes else None, created_at=time.time() if now is None else now, revoked_at=None)
    conn.execute(insert(TokenT).values(key_id=info.key_id, token_hash=token_hash(token), name=info.name, scopes=",".join(info.scopes),
                                       cluster=info.cluster, nodes=info.nodes, created_at=info.created_at))
    return token, info


def list_tokens(conn: Connection, *, include_revoked: bool = True) -> list[TokenInfo]:
    query = select(TokenT).order_by(TokenT.c.id)
    if not include_revoked:
        query = query.where(TokenT.c.revoked_at.is_(None))
    return [_info(row) for row in conn.execute(query)]


def revoke_token(conn: Connection, *, key_id: str, now: float | None = None) -> bool:
    """True if a live token with this key id was revoked."""
    result = conn.execute(update(TokenT).where(TokenT.c.key_id == key_id, TokenT.c.revoked_at.is_(None))
                          .values(revoked_at=time.time() if now is None else now))
    return result.rowcount == 1


def principal_for(conn: Connection, *, token: str) -> Principal | None:
    """The principal a presented token stands for; None if it is malformed, unknown or revoked."""
    key_id = key_id_of(token)
    if key_id is None:
        return None
    row = conn.execute(select(TokenT).where(TokenT.c.key_id == key_id)).first()
    if row is None or row.revoked_at is not None or not hash_matches(token, row.token_hash):
        return None
    return Principal(key_id=row.key_id, name=row.name, scopes=frozenset(row.scopes.split(",")), cluster=row.cluster,
                     nodes=frozenset(row.nodes) if row.nodes is not None else None)


def _info(row) -> TokenInfo:
    return TokenInfo(key_id=row.key_id, name=row.name, scopes=row.scopes.split(","), cluster=row.cluster,
                     nodes=row.nodes, created_at=row.created_at, revoked_at=row.revoked_at)
