"""The spool's index: which unsent record is where (segment, offset, length), oldest first.

It holds 20 bytes per unsent sample (arrays of seq, offset, length), and counts what is still
to be sent: an entry stays until its seq is acknowledged or its segment deleted, but one that
will never be sent (unreadable, or dropped from memory) is *skipped* at once: out of the count.
"""

from __future__ import annotations

import bisect
import collections
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path


class Segment:
    """One segment file and the index of its unsent records (entries from `start` on)."""

    __slots__ = ("lengths", "offsets", "path", "seqs", "size", "start")

    def __init__(self, path: Path, size: int = 0) -> None:
        self.path = path
        self.seqs = array("q")
        self.offsets = array("q")  # -1: the record is only in memory (the disk refused it)
        self.lengths = array("I")
        self.size = size
        self.start = 0

    def add(self, seq: int, offset: int, length: int) -> None:
        self.seqs.append(seq)
        self.offsets.append(offset)
        self.lengths.append(length)

    def pending(self) -> range:
        return range(self.start, len(self.seqs))


class SpoolIndex:
    """The segments, oldest first, the last of them `active` (being appended to), and the count
    and bytes they hold. `on_gone(seq)` hears of every entry that leaves or is skipped, so that
    what is cached for it can go too. Not thread-safe: the spool's lock guards it."""

    def __init__(self, on_gone: Callable[[int], None]) -> None:
        self.segments: collections.deque[Segment] = collections.deque()
        self.active: Segment | None = None
        self.count = 0  # unsent entries, the skipped ones excluded
        self.bytes = 0  # the segment files' sizes
        self._skipped: set[int] = set()
        self._on_gone = on_gone

    def adopt(self, seg: Segment) -> None:
        """A segment found on disk, its entries already added."""
        self.segments.append(seg)
        self.bytes += seg.size
        self.count += len(seg.seqs)

    def start_segment(self, seg: Segment) -> None:
        self.segments.append(seg)
        self.active = seg

    def add(self, seg: Segment, seq: int, offset: int, length: int) -> None:
        seg.add(seq, offset, length)
        self.count += 1

    def resize(self, seg: Segment, size: int) -> None:
        self.bytes += size - seg.size
        seg.size = size

    def unsent(self) -> Iterator[tuple[Segment, int]]:
        """(segment, entry) of every entry still to be sent, oldest first; skipping one while
        iterating is fine."""
        for seg in self.segments:
            for i in seg.pending():
                if seg.seqs[i] not in self._skipped:
                    yield seg, i

    def skip(self, seq: int) -> None:
        """Take an unsent seq out of the count for good (it stays in the index until acked)."""
        if seq not in self._skipped:
            self._skipped.add(seq)
            self.count -= 1
        self._on_gone(seq)

    def ack(self, upto_seq: int) -> list[Segment]:
        """Remove the entries up to `upto_seq`; the segments left with none, which the caller
        deletes (never the active one: it is still being written)."""
        delivered = []
        while self.segments:
            seg = self.segments[0]
            end = bisect.bisect_right(seg.seqs, upto_seq, seg.start)
            for i in range(seg.start, end):
                self._forget(seg.seqs[i])
            seg.start = end
            if end < len(seg.seqs) or seg is self.active:
                break
            delivered.append(self._pop_oldest())
        return delivered

    def shed_oldest(self, max_bytes: int) -> tuple[int, list[Segment]]:
        """While the files exceed `max_bytes`, remove the oldest whole segment but the active one:
        (unsent entries so dropped, the removed segments, which the caller deletes)."""
        dropped, shed = 0, []
        while self.bytes > max_bytes and self.segments and self.segments[0] is not self.active:
            seg = self.segments[0]
            for i in seg.pending():
                if seg.seqs[i] not in self._skipped:
                    dropped += 1
                self._forget(seg.seqs[i])
            shed.append(self._pop_oldest())
        return dropped, shed

    def _pop_oldest(self) -> Segment:
        seg = self.segments.popleft()
        self.bytes -= seg.size
        return seg

    def _forget(self, seq: int) -> None:
        """An entry leaves (acked, or its segment deleted)."""
        if seq in self._skipped:
            self._skipped.discard(seq)
        else:
            self.count -= 1
        self._on_gone(seq)
