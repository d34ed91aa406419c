"""Reopening a spool: rebuild the index from the segment files an earlier agent left."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from agent.spool.index import Segment, SpoolIndex
from agent.spool.records import MIB, scan_records
from agent.spool.segments import segment_files

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Recovered:
    last_seq: int  # the highest seq found, or the ack position: the next record takes the one after
    corrupt: int  # damaged or out-of-order records skipped


def recover(directory: Path, acked: int, index: SpoolIndex) -> Recovered:
    """Index every intact record after `acked`; delete the segments left with none.

    A segment that cannot be read is left in place (perhaps readable another time)."""
    found = Recovered(last_seq=acked, corrupt=0)
    for _, path in segment_files(directory):
        try:
            data = path.read_bytes()
        except OSError as exc:
            log.error("spool %s: cannot read %s, skipping it: %s", directory, path.name, exc)
            continue
        seg = _index_segment(path, data, acked, found)
        if seg.seqs:
            index.adopt(seg)
        else:
            path.unlink(missing_ok=True)  # all delivered (or nothing readable)
    if index.count or found.corrupt:
        log.log(logging.WARNING if found.corrupt else logging.INFO,
                "spool %s: resuming %d unsent samples (%.1f MiB in %d segments); %d damaged records skipped",
                directory, index.count, index.bytes / MIB, len(index.segments), found.corrupt)
    return found


def _index_segment(path: Path, data: bytes, acked: int, found: Recovered) -> Segment:
    seg = Segment(path, size=len(data))
    for record in scan_records(data):
        if record is None:
            found.corrupt += 1
            continue
        offset, length, seq = record
        if seq <= acked:
            continue  # delivered
        if seq <= found.last_seq:
            found.corrupt += 1  # out of order: not written by this spool's agent
            continue
        found.last_seq = seq
        seg.add(seq, offset, length)
    return seg
