"""401, 403 and 409 from the collector: configuration errors, not outages. Retrying sooner cannot
help and a warning per attempt buries the one line that says what to change, so the pusher
keeps the samples, retries slowly, and logs what to fix once (and again only when the answer
changes, rarely while it lasts, and when the collector accepts pushes again).

The hint is built from the structured parts of the collector's answer, not its wording: the
status, the `loc` of the first error (["body", "cluster"], ["body", "node"], ["header",
"authorization"]) and, for a cluster or node refusal, what GET /api/v1/tokens/self says the
token is bound to. The collector's own message is quoted beside it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

CREATE = "laggard token create --scope agent --cluster {cluster}"


@dataclass(frozen=True)
class Refusal:
    status: int
    loc: tuple[str, ...]
    msg: str


def refusal_of(status: int, body: object) -> Refusal:
    """The first error of an ApiError body ({"detail": [{"loc": [...], "msg": ...}]}); any other
    body gives an empty loc and its text as the message."""
    detail = body.get("detail") if isinstance(body, dict) else body
    if isinstance(detail, list) and detail and isinstance(detail[0], dict):
        loc = detail[0].get("loc")
        return Refusal(status, tuple(str(p) for p in loc) if isinstance(loc, list) else (), str(detail[0].get("msg", "")))
    return Refusal(status, (), "" if detail is None else str(detail)[:300])


def needs_binding(refusal: Refusal) -> bool:
    """Whether the hint needs to know what the token is bound to (GET /api/v1/tokens/self)."""
    return refusal.status == 403 and refusal.loc in {("body", "cluster"), ("body", "node")}


def hint(refusal: Refusal, binding: dict | None, *, token_sent: bool, cluster: str | None, node: str) -> str:
    """What to change, in one sentence. `binding`: the token's GET /api/v1/tokens/self answer, or None."""
    binding = binding if isinstance(binding, dict) else {}
    bound_cluster, bound_nodes = binding.get("cluster"), binding.get("nodes")
    create = CREATE.format(cluster=cluster or bound_cluster or "CLUSTER")
    if refusal.status == 401:
        if not token_sent:
            return f"the collector needs a token: pass --token or --token-file (LAGGARD_TOKEN, LAGGARD_TOKEN_FILE) with an agent token ({create})"
        return f"the token is missing, unknown or revoked: make an agent token ({create}) and pass it with --token or --token-file"
    if refusal.loc == ("body", "cluster"):
        if isinstance(bound_cluster, str):
            return (f"token is bound to cluster {bound_cluster}; run with --cluster {bound_cluster} "
                    "(or without --cluster: the agent then asks the collector)")
        return (f"the token is not for cluster {cluster}; run with the --cluster the token was made for "
                "(or without --cluster: the agent then asks the collector)")
    if refusal.loc == ("body", "node"):
        if isinstance(bound_nodes, list) and len(bound_nodes) == 1:
            return (f"token is bound to node {bound_nodes[0]}; run with --node {bound_nodes[0]}, "
                    f"or use a token made for node {node} ({create} --node {node})")
        if isinstance(bound_nodes, list) and bound_nodes:
            return (f"token is bound to nodes {', '.join(map(str, bound_nodes))}, not {node}; "
                    f"use a token made for node {node} ({create} --node {node})")
        return f"the token may not push for node {node}; use a token made for it ({create} --node {node})"
    if refusal.status == 409:
        return (f"another node reports a GPU UUID of this node (see the collector's message): check that --node {node} is this "
                "node's own name and that no copy of this agent runs elsewhere; the samples wait, and are taken once the other "
                "node has stopped reporting the GPU")
    if refusal.loc == ("header", "authorization"):
        return f"the token lacks the agent scope: make an agent token ({create}) and pass it with --token or --token-file"
    return "the collector refuses this agent's pushes; see its message"


class ProblemLog:
    """Logs a lasting problem as ERROR when it starts or changes, then at most once every
    `every` seconds while it lasts (DEBUG in between), and INFO once when it ends."""

    def __init__(self, log: logging.Logger, *, every: float = 3600.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.log, self.every, self._clock = log, every, clock
        self.current: str | None = None
        self._logged_at = 0.0

    def failing(self, key: str, message: str) -> None:
        """`key` says which problem it is: the same key is the same problem, however `message` varies."""
        now = self._clock()
        if key != self.current or now - self._logged_at >= self.every:
            self.log.error("%s%s", message, "" if key != self.current else " (still)")
            self.current, self._logged_at = key, now
        else:
            self.log.debug("%s", message)

    def recovered(self, message: str) -> None:
        if self.current is not None:
            self.log.info("%s", message)
            self.current = None
