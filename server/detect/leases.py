"""Detection sharded by cluster across replicas on PostgreSQL: a replica judges only the clusters
whose lease it holds, so N replicas judge N clusters at once.

A lease is a session advisory lock, pg_try_advisory_lock(LEASE_NS, crc32(cluster)), held on one
dedicated connection per replica with the server-side keepalives of the leader lock
(server/detect/leader.py). Advisory locks rather than a lease table with expiry: when a replica
dies, PostgreSQL ends its session and every lease goes at once (no expiry to wait out, no clock
to trust, no heartbeat writes), the survivors find the clusters free at their next poll, and a
replica whose lock session is gone knows it has lost everything together. Two cluster names
with the same crc32 share one lock: whoever holds it judges both, so a collision costs
balance, never correctness.

Balance: every detecting replica holds the shared lock (MEMBER_NS, 0); pg_locks counts them
(N) and shows who holds which lease. With M leases in use each replica holds M // N or
ceil(M / N): one above that gives the excess back, one below takes free leases, and one above
M // N gives back down to it while another replica starves and too few leases are free.

Locks decide who may judge; they cannot fence a replica that lost its lock between its check
and its commit (a pause, a lost connection). Each holder therefore claims a cluster by raising
its `lease_epoch:<cluster>` row (detector_progress) before reading where judging stands, and
each commit locks that row and checks the epoch it claimed (server/detect/shard.py): a stale
holder's commit is refused, and a new holder's claim waits for a commit already under way.

Rolling upgrade: a collector of an older version judges every cluster while it holds the
leader lock. A leader of this version also holds the shared lock (MEMBER_NS, 1); while the
leader lock is held by a session without it, no replica judges anything here."""

from __future__ import annotations

import logging
import os
import socket
from collections import Counter

from sqlalchemy import Connection, Engine, text

from server.detect.leader import KEEPALIVE, close_lock_session
from server.store.detector_state import LEASE_NS, MEMBER_NS, LockView, as_int4, bucket, read_locks

log = logging.getLogger(__name__)


def plan(*, me: int, view: LockView, buckets: set[int]) -> tuple[list[int], list[int], int]:
    """Towards an even share: the leases to give back, the free ones to try in order, and how
    many of those to take."""
    members = view.members | {me}
    m, n = len(buckets), len(members)
    lo, hi = m // n, -(-m // n)
    counts = Counter(pid for b, pid in view.holders.items() if b in buckets)
    mine = sorted(b for b, pid in view.holders.items() if pid == me and b in buckets)
    gone = sorted(b for b, pid in view.holders.items() if pid == me and b not in buckets)
    free = sorted(b for b in buckets if b not in view.holders)
    others = [pid for pid in members if pid != me]
    missing = sum(max(0, lo - counts[pid]) for pid in others)
    keep = len(mine)
    if keep > hi:
        keep = hi
    elif keep > lo and missing > len(free):
        keep = lo  # another replica starves and the free leases cannot feed it
    if keep < len(mine):
        return gone + mine[keep:], [], 0
    target = lo if any(counts[pid] < lo for pid in others) else hi
    # Replicas polling together start at different free leases: fewer lost races.
    start = me % len(free) if free else 0
    return gone, free[start:] + free[:start], max(0, target - len(mine))


class ClusterLeases:
    """This replica's lock session and the cluster leases on it."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._conn: Connection | None = None
        self.pid: int | None = None
        self.buckets: set[int] = set()

    def poll(self, clusters: set[str]) -> set[str]:
        """Take or give back leases towards an even share; the clusters this replica judges now."""
        if self._conn is None:
            self._join()
        conn = self._conn
        try:
            view = read_locks(conn)
            self.buckets = {b for b, pid in view.holders.items() if pid == self.pid}
            if view.older_leader:
                if self.buckets:
                    log.warning("detector: an older collector leads and judges every cluster; judging nothing meanwhile")
                    self._unlock(sorted(self.buckets))
                return set()
            release, candidates, want = plan(me=self.pid, view=view, buckets={bucket(c) for c in clusters})
            self._unlock(release)
            for key in candidates:
                if want == 0:
                    break
                # Another replica may take it first: then try the next one.
                if conn.execute(text("SELECT pg_try_advisory_lock(:ns, :k)"), {"ns": LEASE_NS, "k": as_int4(key)}).scalar():
                    self.buckets.add(key)
                    want -= 1
            conn.commit()
        except Exception:
            self.release()
            raise
        return {c for c in clusters if bucket(c) in self.buckets}

    def alive(self) -> bool:
        """False (and every lease dropped) when the lock session was lost."""
        if self._conn is None:
            return False
        try:
            self._conn.execute(text("SELECT 1"))
            self._conn.commit()
            return True
        except Exception:
            self.release()
            return False

    def release(self) -> None:
        self.buckets = set()
        if self._conn is not None:
            close_lock_session(self._conn)
            self._conn, self.pid = None, None

    def _join(self) -> None:
        conn = self.engine.connect()
        try:
            if "application_name" not in self.engine.url.query:
                # pg_stat_activity (and laggard_detection_lease_holder) then name the replica.
                conn.execute(text("SELECT set_config('application_name', :v, false)"),
                             {"v": f"laggard {socket.gethostname()} {os.getpid()}"})
            for name, value in KEEPALIVE.items():
                conn.execute(text("SELECT set_config(:n, :v, false)"), {"n": name, "v": value})
            conn.execute(text("SELECT pg_advisory_lock_shared(:ns, 0)"), {"ns": MEMBER_NS})
            self.pid = conn.execute(text("SELECT pg_backend_pid()")).scalar()
            conn.commit()
        except Exception:
            conn.invalidate()
            conn.close()
            raise
        self._conn = conn

    def _unlock(self, keys: list[int]) -> None:
        for key in keys:
            self._conn.execute(text("SELECT pg_advisory_unlock(:ns, :k)"), {"ns": LEASE_NS, "k": as_int4(key)})
            self.buckets.discard(key)
        self._conn.commit()
