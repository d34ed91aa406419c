"""Admission of ingest requests by the work they bring (issue #12; docs/security.md).

Before the body is read: the token's in-flight requests (ConcurrencyCap) and whether it still
has rows left in its budget. After the batch is decoded, when its cost is known, on the
writer's side: a node name the cluster has never had counts against the token's registrations
per minute and the cluster's cap on nodes; then the rows are taken from the token's and the
cluster's budgets. A refusal is a 429 with Retry-After (409 at the node cap), and nothing of
the batch is stored. Anonymous requests (LAGGARD_AUTH__INSECURE) are not limited, as with the request
rate limit: there is no token to hold to account."""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Iterator

from sqlalchemy import Engine, select

from server.auth.ratelimit import RateLimiter
from server.auth.tokens import Principal
from server.auth.worklimit import ConcurrencyCap, WorkBudget
from server.errors import ApiError
from server.ingest.settings import IngestLimits
from server.store import schema
from server.store.samples import UnresolvedBatch
from server.store.slices import row_count

_MAX_CLUSTERS = 10_000  # known-node sets kept; beyond, they are dropped and read again


class Admission:
    def __init__(self, limits: IngestLimits, engine: Engine | None, *, clock: Callable[[], float] = time.monotonic):
        self.limits, self.engine = limits, engine
        self.token_rows = WorkBudget(rate=limits.rows_per_s_per_token, burst=limits.rows_burst_per_token, clock=clock)
        self.cluster_rows = WorkBudget(rate=limits.rows_per_s_per_cluster, burst=limits.rows_burst_per_cluster, clock=clock)
        per_min = limits.node_registrations_per_min_per_token
        self.registrations = RateLimiter(rate=per_min / 60.0, burst=max(1.0, per_min), clock=clock)
        self.in_flight = ConcurrencyCap(limits.max_concurrent_per_token)
        self._known: dict[str, set[str]] = {}  # cluster -> its node names (read once from the database)
        self._known_lock = threading.Lock()

    @contextlib.contextmanager
    def request(self, principal: Principal) -> Iterator[None]:
        """Hold one of the token's in-flight places for the request's life."""
        key = principal.key_id
        if not self.limits.enabled or not key:
            yield
            return
        if not self.in_flight.enter(key):
            raise _too_much(f"more than {self.limits.max_concurrent_per_token} ingest requests of this token in flight", 1.0)
        try:
            if (wait := self.token_rows.wait(key)) > 0:
                raise _too_much(f"this token sent more than its {self.limits.rows_per_s_per_token:g} rows/s", wait)
            yield
        finally:
            self.in_flight.leave(key)

    def job(self, decode: Callable[[], UnresolvedBatch], principal: Principal, *, raw: bytes,
            gzipped: bool) -> tuple[Callable[[], UnresolvedBatch], str, int]:
        """What the writer's submit() takes: `decode` followed by the checks that need the
        decoded batch, the lane the job waits in (server/store/fair_queue.py: the token's), and
        the body's size once decompressed (large ones are decoded off the writer's thread)."""
        return self.checked(decode, principal), principal.key_id, body_bytes(raw, gzipped=gzipped)

    def checked(self, decode: Callable[[], UnresolvedBatch], principal: Principal) -> Callable[[], UnresolvedBatch]:
        """`decode`, followed by the checks that need the decoded batch."""
        if not self.limits.enabled or not principal.key_id:
            return decode

        def decode_and_admit() -> UnresolvedBatch:
            # Checked again just before decoding: large bodies are decoded one at a time
            # (server/store/writer.py), so a token's second one waiting behind its first is
            # refused once the first has spent the balance, without being decoded at all.
            if (wait := self.token_rows.wait(principal.key_id)) > 0:
                raise _too_much(f"this token sent more than its {self.limits.rows_per_s_per_token:g} rows/s", wait)
            batch = decode()
            self.admit(batch, principal.key_id)
            return batch

        return decode_and_admit

    def admit(self, batch: UnresolvedBatch, key: str) -> None:
        self._admit_node(batch.cluster, batch.node, key)
        wait = max(self.token_rows.wait(key), self.cluster_rows.wait(batch.cluster))
        if wait > 0:
            raise _too_much(f"cluster {batch.cluster!r} or this token sent more rows than its limit allows", wait)
        rows = row_count(batch)
        self.token_rows.take(key, rows)
        self.cluster_rows.take(batch.cluster, rows)

    def _admit_node(self, cluster: str, node: str, key: str) -> None:
        known = self._known_nodes(cluster)
        with self._known_lock:
            if node in known:
                return
            if len(known) >= self.limits.max_nodes_per_cluster:
                raise ApiError(409, f"cluster {cluster!r} has {len(known)} nodes, the most LAGGARD_INGEST_LIMITS__MAX_NODES_PER_CLUSTER "
                                    f"allows; node {node!r} is not registered", loc=["body", "node"], type="too_many_nodes")
            if (wait := self.registrations.take(key)) > 0:
                raise _too_much(f"this token registered more than {self.limits.node_registrations_per_min_per_token:g} new node "
                                f"names in a minute; node {node!r} is not registered yet", wait, loc=["body", "node"])
            known.add(node)

    def _known_nodes(self, cluster: str) -> set[str]:
        with self._known_lock:
            known = self._known.get(cluster)
        if known is not None:
            return known
        names = set()
        if self.engine is not None:
            with self.engine.connect() as conn:
                names = set(conn.execute(select(schema.Node.name).where(schema.Node.cluster == cluster)).scalars())
        with self._known_lock:
            if len(self._known) >= _MAX_CLUSTERS:
                self._known.clear()
            return self._known.setdefault(cluster, names)


def body_bytes(raw: bytes, *, gzipped: bool) -> int:
    """The body's size decompressed: for gzip, what its trailer says (ISIZE, the size modulo
    2**32; the decoder checks it against what it inflates, so a false one fails the request)."""
    if gzipped and len(raw) >= 18:
        return int.from_bytes(raw[-4:], "little")
    return len(raw)


def _too_much(msg: str, wait_s: float, *, loc: list | None = None) -> ApiError:
    return ApiError(429, msg, loc=loc or ["header", "authorization"], type="rate_limited",
                    headers={"Retry-After": str(max(1, math.ceil(wait_s)))})
