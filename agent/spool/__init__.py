"""The agent's durable, bounded queue of samples waiting for the collector (docs/agent.md, "Spool").

One directory per agent:

    lock                              flock()ed while an agent has the spool open   (directory.py)
    ack.json                          {"acked_seq": N}: every record with seq <= N was delivered   (ack.py)
    seg-<first seq, 20 digits>.log    append-only segments of records, oldest first   (segments.py, records.py)

In memory: the index of what is where (index.py) and the recent samples (cache.py); reopening
rebuilds the index from the files (recovery.py). `DiskSpool` (disk_spool.py) puts them together.
"""

from agent.spool.ack import ACK_FILE
from agent.spool.directory import LOCK_FILE, SpoolError
from agent.spool.disk_spool import ACK_INTERVAL_S, DEFAULT_MAX_BYTES, FSYNC_INTERVAL_S, MIN_MAX_BYTES, DiskSpool
from agent.spool.records import HEADER, MAGIC, MAX_RECORD_BYTES, MIB, encode_record, record_at, scan_records
from agent.spool.segments import DISK_RETRY_S, ERROR_LOG_EVERY_S, SEGMENT_PREFIX, SEGMENT_SUFFIX, segment_name

__all__ = [
    "ACK_FILE", "ACK_INTERVAL_S", "DEFAULT_MAX_BYTES", "DISK_RETRY_S", "ERROR_LOG_EVERY_S", "FSYNC_INTERVAL_S", "HEADER",
    "LOCK_FILE", "MAGIC", "MAX_RECORD_BYTES", "MIB", "MIN_MAX_BYTES", "SEGMENT_PREFIX", "SEGMENT_SUFFIX", "DiskSpool",
    "SpoolError", "encode_record", "record_at", "scan_records", "segment_name",
]
