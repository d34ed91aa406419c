"""DiskSpool: the SampleQueue (agent/push.py) that the pieces of this package make together.

It owns the lock that makes them thread-safe, the order of things (a seq is given out, the
record written, the index told), the size cap and the fsync thread.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from agent.sample import Sample
from agent.spool.ack import AckPosition
from agent.spool.cache import RecordCache
from agent.spool.directory import lock_directory
from agent.spool.index import Segment, SpoolIndex
from agent.spool.records import HEADER, MIB, decode_payload, encode_payload, encode_record, record_at
from agent.spool.recovery import recover
from agent.spool.segments import ERROR_LOG_EVERY_S, SegmentReader, SegmentWriter, delete_segment, file_size, fsync_files, segment_name

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 256 * MIB
MIN_MAX_BYTES = 64 * 1024
# Each fsync costs the agent CPU in the kernel, and at 1 Hz sampling the two of them a second
# were a fifth of the agent's whole budget (bench/agent.py); 5 s is one sample at the default
# interval, lost only to a power cut or kernel crash, never to a crash of the agent.
FSYNC_INTERVAL_S = 5.0
ACK_INTERVAL_S = 5.0


class DiskSpool:
    """FIFO of (seq, Sample) on disk; see the package docstring. Thread-safe."""

    durable = True

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        segment_bytes: int | None = None,
        fsync_interval: float = FSYNC_INTERVAL_S,
        ack_interval: float = ACK_INTERVAL_S,
        cache_size: int = 64,
        max_memory_samples: int = 720,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_bytes < MIN_MAX_BYTES:
            raise ValueError(f"spool size cap {max_bytes} bytes: must be at least {MIN_MAX_BYTES} (64 KiB)")
        # Many segments per cap: dropping one whole segment drops a small share of the spool.
        self.segment_bytes = segment_bytes or max(4096, min(4 * MIB, max_bytes // 32))
        if not 0 < self.segment_bytes <= max_bytes // 2:
            raise ValueError(f"segment size {self.segment_bytes}: must be positive and at most half the cap")
        self.dir = Path(directory)
        self.max_bytes = max_bytes
        self.fsync_interval, self.ack_interval = fsync_interval, ack_interval
        self.cache_size, self.max_memory_samples = cache_size, max_memory_samples
        self._clock = clock
        self.dropped = 0  # unsent samples deleted to stay under the cap
        self.corrupt = 0  # damaged records skipped (on recovery, or when read back)
        self._lock = threading.Lock()
        self._cache = RecordCache(cache_size)
        self._index = SpoolIndex(on_gone=self._cache.drop)
        now = clock()
        self._ack = AckPosition(self.dir, interval=ack_interval, clock=clock, now=now)
        self._writer = SegmentWriter(self.dir, clock=clock, now=now, memory_samples=max_memory_samples)
        self._reader = SegmentReader()
        self._next_seq = 0
        self._drop_logged_at: float | None = None  # drops are logged at most once a minute
        self._unlogged_drops = 0
        self._closed = False
        self._lock_file = lock_directory(self.dir)
        try:
            self._recover()
        except BaseException:
            self._lock_file.close()
            raise
        self._stop_sync = threading.Event()
        self._syncer = threading.Thread(target=self._sync_loop, name="spool-fsync", daemon=True)
        self._syncer.start()

    def _recover(self) -> None:
        found = recover(self.dir, self._ack.load(), self._index)
        self.corrupt += found.corrupt
        self._next_seq = found.last_seq + 1
        self._enforce_cap()

    # --- SampleQueue ----------------------------------------------------------------------------

    def put(self, sample: Sample) -> None:
        try:
            payload = encode_payload(sample)
        except (TypeError, ValueError) as exc:  # a bug, not the disk: the collector would refuse it too
            log.error("cannot spool a sample, dropping it: %s", exc)
            return
        with self._lock:
            if self._closed:
                raise ValueError("the spool is closed")
            seq = self._next_seq
            self._next_seq += 1
            seg = self._segment_for(len(payload), seq)
            offset = self._append(seg, seq, payload)
            self._index.add(seg, seq, offset, len(payload))
            if offset < 0:
                self._cache.pin(seq, payload)
            else:
                self._cache.keep_payload(seq, payload)
            self._cache.keep_sample(seq, sample)
            self._enforce_cap()

    def peek(self, n: int) -> list[tuple[int, Sample]]:
        return self._peek(n, self._sample)

    def peek_encoded(self, n: int) -> list[tuple[int, bytes]]:
        """Like peek(), with each sample as its JSON (what json.dumps(sample) with
        agent.sample.json_default and compact separators gives): the pusher splices these into
        the request body as they are."""
        return self._peek(n, self._payload)

    def _peek(self, n: int, get: Callable[[Segment, int], object | None]) -> list:
        out: list = []
        if n < 1:
            return out
        with self._lock:
            for seg, i in self._index.unsent():
                item = get(seg, i)
                if item is None:  # unreadable: never to be sent
                    self._index.skip(seg.seqs[i])
                    continue
                out.append((seg.seqs[i], item))
                if len(out) >= n:
                    return out
        return out

    def ack(self, upto_seq: int) -> None:
        with self._lock:
            upto_seq = min(upto_seq, self._next_seq - 1)  # never ack a seq not yet given out
            if not self._ack.advance(upto_seq):
                return
            for seg in self._index.ack(upto_seq):
                self._delete(seg)
            save_now = self._ack.save_due()
        if save_now:  # else the sync thread saves it within fsync_interval
            self._ack.save()

    def __len__(self) -> int:
        return self._index.count

    @property
    def size_bytes(self) -> int:
        return self._index.bytes

    @property
    def write_errors(self) -> int:
        return self._writer.errors

    def close(self) -> None:
        """fsync, save the ack position, release the directory. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop_sync.set()
        self._syncer.join()
        with self._lock:
            self._writer.close()
            self._reader.close()
        self.sync()
        self._lock_file.close()  # releases the flock

    def __enter__(self) -> DiskSpool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- writing --------------------------------------------------------------------------------

    def _segment_for(self, length: int, seq: int) -> Segment:
        seg = self._index.active
        if seg is None:
            return self._open_segment(seq)
        if not self._writer.is_open:
            return self._open_segment(seq) if self._writer.retry_due() else seg
        if seg.size > 0 and seg.size + HEADER.size + length > self.segment_bytes:
            return self._open_segment(seq)
        return seg

    def _open_segment(self, first_seq: int) -> Segment:
        seg = Segment(self.dir / segment_name(first_seq))
        self._writer.open(seg.path)
        self._index.start_segment(seg)
        return seg

    def _append(self, seg: Segment, seq: int, payload: bytes) -> int:
        """Write one record; its offset, or -1 when the disk refused it."""
        if not self._writer.is_open:
            return -1
        record = encode_record(seq, payload)
        if not self._writer.append(record):
            self._index.resize(seg, file_size(seg.path, seg.size))
            return -1
        offset = seg.size
        self._index.resize(seg, seg.size + len(record))
        return offset

    # --- fsync, off the sampling thread ---------------------------------------------------------

    def _sync_loop(self) -> None:
        while not self._stop_sync.wait(self.fsync_interval):
            self.sync()

    def sync(self) -> None:
        """fsync everything written so far. A background thread calls this every
        `fsync_interval` seconds, so that a slow disk holds up that thread, never put()."""
        with self._lock:
            fds, dir_dirty = self._writer.take_unsynced()
        fsync_files(self.dir, fds, dir_dirty)
        self._ack.save()

    # --- bounds ---------------------------------------------------------------------------------

    def _enforce_cap(self) -> None:
        dropped, shed = self._index.shed_oldest(self.max_bytes)
        for seg in shed:
            self._delete(seg)
        while len(self._cache.pinned) > self.max_memory_samples:
            self._index.skip(next(iter(self._cache.pinned)))
            dropped += 1
        if dropped:
            self._count_drops(dropped)

    def _count_drops(self, dropped: int) -> None:
        self.dropped += dropped
        self._unlogged_drops += dropped
        now = self._clock()
        if self._drop_logged_at is None or now - self._drop_logged_at >= ERROR_LOG_EVERY_S:
            self._drop_logged_at = now
            log.warning("spool %s full (cap %.1f MiB): dropped the %d oldest unsent samples (%d dropped in all)",
                        self.dir, self.max_bytes / MIB, self._unlogged_drops, self.dropped)
            self._unlogged_drops = 0

    def _delete(self, seg: Segment) -> None:
        self._reader.forget(seg.path)
        delete_segment(seg.path)

    # --- reading back ---------------------------------------------------------------------------

    def _sample(self, seg: Segment, i: int) -> Sample | None:
        seq = seg.seqs[i]
        sample = self._cache.sample(seq)
        if sample is None:
            payload = self._payload(seg, i)
            if payload is None:
                return None
            try:
                sample = decode_payload(payload)
            except ValueError as exc:  # passed its CRC, so written so by a buggy agent: skip it
                return self._damaged(seg, seq, f"not a sample: {exc}")
            self._cache.keep_sample(seq, sample)
        return sample

    def _payload(self, seg: Segment, i: int) -> bytes | None:
        seq, offset, length = seg.seqs[i], seg.offsets[i], seg.lengths[i]
        payload = self._cache.payload(seq)
        if payload is not None:
            return payload
        if offset < 0:
            return self._damaged(seg, seq, "kept only in memory, and lost")
        try:
            data = self._reader.read(seg.path, offset, HEADER.size + length)
        except OSError as exc:
            return self._damaged(seg, seq, str(exc))
        if record_at(data, 0) != (length, seq):
            return self._damaged(seg, seq, "damaged on disk")
        payload = data[HEADER.size:]
        self._cache.keep_payload(seq, payload)
        return payload

    def _damaged(self, seg: Segment, seq: int, problem: str) -> None:
        """Count and log an unreadable record (None, for the caller to return)."""
        self.corrupt += 1
        log.error("spool %s: skipping sample seq %d in %s: %s", self.dir, seq, seg.path.name, problem)
