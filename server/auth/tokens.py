"""Token format and scopes. A token reads `lgd_<key id>_<secret>`: the key id (public, shown by
`laggard token list`) finds the row, the SHA-256 of the whole token is what is stored and is
compared in constant time. The secret is 32 random bytes, so a plain hash is enough: there is
nothing to brute-force that a slow password hash would protect."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import secrets

PREFIX = "lgd"
KEY_ID_HEX = 12

AGENT, READ, ADMIN, SCHEDULER = "agent", "read", "admin", "scheduler"
SCOPES = (AGENT, READ, ADMIN, SCHEDULER)


@dataclasses.dataclass(frozen=True)
class Principal:
    """What a presented token may do. `cluster` and `nodes` bind an agent token to its own
    cluster (and, optionally, named nodes); None means any."""

    key_id: str
    name: str
    scopes: frozenset[str]
    cluster: str | None = None
    nodes: frozenset[str] | None = None

    def allows(self, scope: str) -> bool:
        return scope in self.scopes or ADMIN in self.scopes

    def may_push(self, *, cluster: str, node: str) -> str | None:
        """None if this principal may push samples for (cluster, node), else why not."""
        if ADMIN in self.scopes:
            return None
        if self.cluster is not None and cluster != self.cluster:
            return f"this token may push for cluster {self.cluster!r} only, not {cluster!r}"
        if self.nodes is not None and node not in self.nodes:
            return f"this token may not push for node {node!r}"
        return None


# Used when auth is off (LAGGARD_AUTH__INSECURE): everything is allowed.
ANONYMOUS = Principal(key_id="", name="insecure", scopes=frozenset({ADMIN}))


def new_token() -> tuple[str, str]:
    """(token, key id): the token is shown once and never stored."""
    key_id = secrets.token_hex(KEY_ID_HEX // 2)
    return f"{PREFIX}_{key_id}_{secrets.token_urlsafe(32)}", key_id


def key_id_of(token: str) -> str | None:
    """The key id of a well-formed token, else None."""
    prefix, sep, rest = token.partition("_")
    key_id, sep2, secret = rest.partition("_")
    if prefix != PREFIX or not sep or not sep2 or len(key_id) != KEY_ID_HEX or not secret:
        return None
    return key_id


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def hash_matches(token: str, stored_hash: str) -> bool:
    return hmac.compare_digest(token_hash(token), stored_hash)


def parse_scopes(values: list[str] | tuple[str, ...]) -> frozenset[str]:
    scopes = frozenset(s.strip() for v in values for s in v.split(",") if s.strip())
    unknown = scopes - set(SCOPES)
    if unknown:
        raise ValueError(f"unknown scope(s) {', '.join(sorted(unknown))}; known: {', '.join(SCOPES)}")
    if not scopes:
        raise ValueError(f"at least one scope is needed: {', '.join(SCOPES)}")
    return scopes
