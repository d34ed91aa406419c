"""Exactly one leader per database: whichever process holds the lock leads, and another takes
over when that process dies (the lock dies with it). On SQLite the leader runs the detector; on
PostgreSQL it dispatches alerts and maintains the shared metrics, while detection is shared
out by cluster among the replicas (server/detect/leases.py).

SQLite: an exclusive flock on a side file. PostgreSQL: a session advisory lock held on a
dedicated connection. When the leader's process dies, its socket closes and PostgreSQL ends the
session (and the lock) at once; when its host or network dies instead, nothing closes the
socket, so the lock session asks the server for short TCP keepalives and a user timeout: the
server drops it, and another replica takes over, within about LOCK_SESSION_TIMEOUT_S.

The leader also says which replica it belongs to (`replica`: host:port unless set), for the
processes that export fleet-level metrics only where the leader is (server/metrics/exporter.py):
written into the side file on SQLite, a shared advisory lock (REPLICA_NS, crc32(replica)) on the
lock session on PostgreSQL."""

from __future__ import annotations

import fcntl
import os

from sqlalchemy import Engine, text

from server.store.detector_state import ADVISORY_KEY, MEMBER_NS, REPLICA_NS, SHARDING_LEADER, as_int4, leader_side_file, replica_key

# Server-side keepalive of the lock session: idle 5 s, then 3 probes 2 s apart; unacknowledged
# sends give up after 15 s. Per-session settings: no postgresql.conf change needed.
LOCK_SESSION_TIMEOUT_S = 15
KEEPALIVE = {"tcp_keepalives_idle": "5", "tcp_keepalives_interval": "2", "tcp_keepalives_count": "3",
             "tcp_user_timeout": str(LOCK_SESSION_TIMEOUT_S * 1000)}


class LeaderLock:
    def __init__(self, engine: Engine, *, replica: str = ""):
        self.engine = engine
        self.replica = replica
        self._fd: int | None = None
        self._conn = None

    def try_acquire(self) -> bool:
        if self.held:
            return True
        if self.engine.dialect.name == "sqlite":
            return self._flock()
        return self._advisory()

    @property
    def held(self) -> bool:
        return self._fd is not None or self._conn is not None

    def still_held(self) -> bool:
        """False when the database connection holding the advisory lock was lost."""
        if self._conn is None:
            return self._fd is not None
        try:
            self._conn.execute(text("SELECT 1"))
            return True
        except Exception:
            self.release()
            return False

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None
        if self._conn is not None:
            close_lock_session(self._conn)
            self._conn = None

    def _flock(self) -> bool:
        database = self.engine.url.database
        if not database or database == ":memory:":
            self._fd = os.open(os.devnull, os.O_RDONLY)
            return True
        fd = os.open(leader_side_file(database), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.pwrite(fd, self.replica.encode(), 0)
        self._fd = fd
        return True

    def _advisory(self) -> bool:
        conn = self.engine.connect()
        try:
            # The marker first: no replica ever sees this leader without it.
            conn.execute(text("SELECT pg_advisory_lock_shared(:ns, :k)"), {"ns": MEMBER_NS, "k": SHARDING_LEADER})
            got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": ADVISORY_KEY}).scalar()
        except Exception:
            conn.invalidate()  # never back to the pool with a lock on it
            conn.close()
            raise
        if got:
            for name, value in KEEPALIVE.items():
                # Ignored by the server on a Unix socket, where a dead peer is seen at once anyway.
                conn.execute(text("SELECT set_config(:n, :v, false)"), {"n": name, "v": value})
            conn.execute(text("SELECT pg_advisory_lock_shared(:ns, :k)"), {"ns": REPLICA_NS, "k": as_int4(replica_key(self.replica))})
            conn.commit()
            self._conn = conn
            return True
        conn.execute(text("SELECT pg_advisory_unlock_shared(:ns, :k)"), {"ns": MEMBER_NS, "k": SHARDING_LEADER})
        conn.commit()
        conn.close()
        return False


def close_lock_session(conn) -> None:
    """Close a connection that holds advisory locks for real, not back into the pool: a pooled
    session would keep its locks."""
    try:
        conn.invalidate()
        conn.close()
    except Exception:
        pass
