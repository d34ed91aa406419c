"""What the detector keeps outside its process, named once for the detector and for the
readers that report on it (server/metrics): its progress rows (detector_progress) and the
advisory locks by which replicas share detection on PostgreSQL (pg_locks)."""

from __future__ import annotations

import fcntl
import os
import zlib
from dataclasses import dataclass

from sqlalchemy import Connection, text

# --- detector_progress keys -------------------------------------------------------------------
LEGACY_CURSOR_KEY = "ingest_log.low_water"  # one position for every cluster, before sharding
CURSOR_PREFIX = "ingest_log.low_water:"
JUDGED_PREFIX = "judged_until:"  # per cluster: every node still reporting judged up to here (the lag gauge)
NODE_PREFIX = "judged_node:"  # per node, "<cluster>/<node>" (neither may contain "/"): where its judging resumes
EPOCH_PREFIX = "lease_epoch:"

# --- advisory locks ---------------------------------------------------------------------------
ADVISORY_KEY = zlib.crc32(b"laggard-detector")  # the leader lock
# Shared advisory locks (MEMBER_NS, 0): one per replica judging its share of the clusters; and
# (MEMBER_NS, SHARDING_LEADER): held by a leader that judges only its share
# (server/detect/leases.py). A leader without it is an older version that judges everything.
MEMBER_NS = zlib.crc32(b"laggard-detector-replicas") & 0x7FFFFFFF
SHARDING_LEADER = 1
LEASE_NS = zlib.crc32(b"laggard-cluster-lease") & 0x7FFFFFFF
# (REPLICA_NS, crc32(replica)): held shared by the leader's lock session beside the leader lock, so
# that every process can tell whether the leader belongs to its own replica (the one that then
# exports the fleet-level series, server/metrics/exporter.py) without trusting application_name.
REPLICA_NS = zlib.crc32(b"laggard-leader-replica") & 0x7FFFFFFF
_LOCKS_SQL = text(
    "SELECT l.pid, l.classid::bigint, l.objid::bigint, l.objsubid, a.application_name FROM pg_locks l "
    "LEFT JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
    "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


def bucket(cluster: str) -> int:
    """The lease key of a cluster: crc32 of its name, as pg_locks shows it (unsigned)."""
    return zlib.crc32(cluster.encode())


def replica_key(replica: str) -> int:
    """The lock key naming a replica, as pg_locks shows it (unsigned)."""
    return zlib.crc32(replica.encode())


def as_int4(key: int) -> int:
    return key - (1 << 32) if key >= 1 << 31 else key


@dataclass
class LockView:
    """Who holds what, from pg_locks: member pids, lease holders by bucket, and whether an older
    version leads."""

    members: set[int]
    holders: dict[int, int]
    names: dict[int, str]
    older_leader: bool


def read_locks(conn: Connection) -> LockView:
    members, holders, names, leader, sharding = set(), {}, {}, None, set()
    for pid, classid, objid, objsubid, name in conn.execute(_LOCKS_SQL).all():
        names[pid] = name or f"pid {pid}"
        if objsubid == 2 and classid == MEMBER_NS and objid == 0:
            members.add(pid)
        elif objsubid == 2 and classid == MEMBER_NS and objid == SHARDING_LEADER:
            sharding.add(pid)
        elif objsubid == 2 and classid == LEASE_NS:
            holders[objid] = pid
        elif objsubid == 1 and classid == 0 and objid == ADVISORY_KEY:
            leader = pid
    return LockView(members | set(holders.values()), holders, names, leader is not None and leader not in sharding)


def holder_names(conn: Connection) -> dict[int, str]:
    """Lease bucket → application_name of the session holding it (the metrics read this)."""
    view = read_locks(conn)
    return {b: view.names[pid] for b, pid in view.holders.items()}


def backlog(conn: Connection, progress: dict[str, float]) -> int:
    """Committed batches beyond the read position of their cluster (server/detect/shard.py);
    a cluster without one of its own counts from the position kept before sharding."""
    positions = [v for k, v in progress.items() if k.startswith(CURSOR_PREFIX) or k == LEGACY_CURSOR_KEY]
    floor, legacy = min(positions, default=0.0), progress.get(LEGACY_CURSOR_KEY, 0.0)
    return conn.execute(text(
        "SELECT count(*) FROM ingest_log l JOIN nodes n ON n.id = l.node_id "
        "LEFT JOIN detector_progress p ON p.key = :prefix || n.cluster "
        "WHERE l.id > :floor AND l.id > COALESCE(p.value, :legacy)"
    ), {"prefix": CURSOR_PREFIX, "floor": floor, "legacy": legacy}).scalar()


def leader_side_file(database: str) -> str:
    """SQLite: the file whose exclusive flock is the leader lock; it holds the leader's replica."""
    return f"{database}.detector-lock"


def leader_is(conn: Connection, replica: str) -> bool | None:
    """Whether the process leading detection belongs to `replica`; None when none leads."""
    if conn.dialect.name != "postgresql":
        database = conn.engine.url.database
        return _side_file_names(leader_side_file(database), replica) if database and database != ":memory:" else None
    return conn.execute(text(
        "SELECT bool_or(m.pid IS NOT NULL) FROM pg_locks l LEFT JOIN pg_locks m ON m.pid = l.pid AND m.locktype = 'advisory' "
        "AND m.granted AND m.classid::bigint = :ns AND m.objid::bigint = :r AND m.objsubid = 2 "
        "WHERE l.locktype = 'advisory' AND l.granted AND l.classid::bigint = 0 AND l.objid::bigint = :k AND l.objsubid = 1 "
        "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    ), {"ns": REPLICA_NS, "r": replica_key(replica), "k": ADVISORY_KEY}).scalar()


def _side_file_names(path: str, replica: str) -> bool | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:  # held: by the leader, whose replica the file names
            return os.pread(fd, 4096, 0).decode(errors="replace") == replica
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
