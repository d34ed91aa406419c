"""DiskSpool: the agent's durable, bounded queue of samples waiting for the collector.

A SampleQueue (agent/push.py) kept in one directory per agent:

    lock                              flock()ed while an agent has the spool open
    ack.json                          {"acked_seq": N}: every record with seq <= N was delivered
    seg-<first seq, 20 digits>.log    append-only segments of records, oldest first

A record is a 20-byte little-endian header and a payload:

    magic   b"LGS1"   format version 1; also where reading resumes after a damaged stretch
    length  u32       payload bytes
    seq     u64       increases across segments and restarts
    crc     u32       CRC-32 of length, seq and payload
    payload           the sample's v1 dict as JSON (docs/protocol.md), so that any later agent
                      version can read a spool an older one left behind

Durability (docs/agent.md, "Spool"):
- put() hands each record to the kernel before it returns: a crash of the agent process
  (kill -9, OOM kill) loses nothing.
- A background thread fsyncs what was written every `fsync_interval` seconds (and the
  directory after a new segment); close() fsyncs too. A power cut or kernel crash can lose the
  last `fsync_interval` seconds of samples; fsync never runs on the sampling thread, so a slow
  disk cannot delay a sample. A record torn by a power cut fails its CRC and is skipped, and
  counted, when the spool is reopened.
- The ack position is replaced atomically (temp file, fsync, rename), at the first ack after
  `ack_interval` seconds since the last save (or put), and at close. A crash can lose about that
  much ack progress: those samples are sent again, and the collector stores each (gpu, ts)
  once (INSERT ... ON CONFLICT DO NOTHING).
- An opened spool never appends to an old segment; it starts a new one, so a torn record
  stays at the end of its file.

Bounds: segments roll at `segment_bytes`; while the files exceed `max_bytes`, the oldest whole
segment is deleted and its unsent samples are counted in `dropped` and logged. If the disk
refuses a write (full, read-only), samples wait in memory (up to `max_memory_samples`, then
oldest dropped) and the disk is tried again every DISK_RETRY_S seconds.

CPU: a put is one json.dumps, one CRC and one write(). peek_encoded() hands the pusher each
sample's stored JSON, which is exactly its part of the request body, so a spooled sample is
encoded once, and a back-fill neither decodes nor re-encodes. Samples put recently stay in
memory (`cache_size`), so with a reachable collector nothing is read back from disk. The
in-memory index holds 20 bytes per unsent sample (arrays of seq, offset, length).
"""

from __future__ import annotations

import bisect
import collections
import fcntl
import json
import logging
import os
import struct
import threading
import time
import zlib
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from agent.sample import Sample, json_default, sample_from_dict

log = logging.getLogger(__name__)

MIB = 1024 * 1024
DEFAULT_MAX_BYTES = 256 * MIB
MIN_MAX_BYTES = 64 * 1024
MAGIC = b"LGS1"
HEADER = struct.Struct("<4sIQI")
_CRC_PREFIX = struct.Struct("<IQ")
MAX_RECORD_BYTES = 64 * MIB  # a length beyond this is damage, not a sample
ACK_FILE = "ack.json"
LOCK_FILE = "lock"
SEGMENT_PREFIX, SEGMENT_SUFFIX = "seg-", ".log"
DISK_RETRY_S = 10.0
ERROR_LOG_EVERY_S = 60.0


class SpoolError(Exception):
    """The spool directory cannot be used (not writable, or another agent holds it)."""


# Each fsync costs the agent CPU in the kernel, and at 1 Hz sampling the two of them a second
# were a fifth of the agent's whole budget (bench/agent.py); 5 s is one sample at the default
# interval, lost only to a power cut or kernel crash, never to a crash of the agent.
FSYNC_INTERVAL_S = 5.0
ACK_INTERVAL_S = 5.0


def segment_name(first_seq: int) -> str:
    return f"{SEGMENT_PREFIX}{first_seq:020d}{SEGMENT_SUFFIX}"


def encode_record(seq: int, payload: bytes) -> bytes:
    crc = zlib.crc32(payload, zlib.crc32(_CRC_PREFIX.pack(len(payload), seq)))
    return HEADER.pack(MAGIC, len(payload), seq, crc) + payload


def record_at(data: bytes, pos: int) -> tuple[int, int] | None:
    """(payload length, seq) of an intact record starting at data[pos], else None."""
    if pos + HEADER.size > len(data):
        return None
    magic, length, seq, crc = HEADER.unpack_from(data, pos)
    if magic != MAGIC or length > MAX_RECORD_BYTES or pos + HEADER.size + length > len(data):
        return None
    start = pos + HEADER.size
    payload = memoryview(data)[start:start + length]
    if zlib.crc32(payload, zlib.crc32(_CRC_PREFIX.pack(length, seq))) != crc:
        return None
    return length, seq


def scan_records(data: bytes) -> Iterator[tuple[int, int, int] | None]:
    """(offset, payload length, seq) of each intact record in a segment's bytes, in order.

    A damaged or torn stretch yields one None and reading resumes at the next intact record
    (found by its magic), so one bad record costs only itself."""
    pos = 0
    while pos < len(data):
        found = record_at(data, pos)
        if found is not None:
            yield pos, found[0], found[1]
            pos += HEADER.size + found[0]
            continue
        yield None
        pos = data.find(MAGIC, pos + 1)
        while pos != -1 and record_at(data, pos) is None:
            pos = data.find(MAGIC, pos + 1)
        if pos == -1:
            return


class _Segment:
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


class DiskSpool:
    """FIFO of (seq, Sample) on disk; see the module docstring. Thread-safe."""

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
        self.write_errors = 0
        self._lock = threading.Lock()
        self._ack_lock = threading.Lock()  # one ack.json writer at a time
        self._segments: collections.deque[_Segment] = collections.deque()
        self._active: _Segment | None = None  # the segment put() appends to
        self._file: BinaryIO | None = None  # its open file; None: the disk refused the last write
        self._readers: dict[Path, BinaryIO] = {}
        # Bounded caches (oldest evicted first) of what is also on disk: decoded samples and
        # their stored JSON.
        self._samples: dict[int, Sample] = {}
        self._payloads: dict[int, bytes] = {}
        self._pinned: dict[int, bytes] = {}  # JSON of samples the disk refused: the only copy
        self._skipped: set[int] = set()  # unsent seqs that will never be sent (unreadable, or dropped)
        self._count = 0  # unsent samples, excluding _skipped
        self._bytes = 0
        self._acked = self._acked_saved = -1
        self._next_seq = 0
        now = clock()
        self._ack_due = self._disk_retry_at = now
        self._unsynced_fds: list[int] = []  # written, not yet fsynced (duplicated descriptors)
        self._dirty = self._dir_dirty = False
        self._error_logged_at: float | None = None
        self._drop_logged_at: float | None = None  # drops are logged at most once a minute
        self._unlogged_drops = 0
        self._closed = False
        self._lock_file = self._take_lock()
        try:
            self._recover()
        except BaseException:
            self._lock_file.close()
            raise
        self._stop_sync = threading.Event()
        self._syncer = threading.Thread(target=self._sync_loop, name="spool-fsync", daemon=True)
        self._syncer.start()

    # --- opening --------------------------------------------------------------------------------

    def _take_lock(self) -> BinaryIO:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            lock_file = open(self.dir / LOCK_FILE, "ab")
        except OSError as exc:
            raise SpoolError(f"cannot use spool directory {self.dir}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock_file.close()
            raise SpoolError(f"spool directory {self.dir} is in use by another agent") from None
        if not os.access(self.dir, os.W_OK):
            lock_file.close()
            raise SpoolError(f"spool directory {self.dir} is not writable")
        return lock_file

    def _recover(self) -> None:
        self._acked = self._acked_saved = self._load_ack()
        last_seq = self._acked
        for tmp in self.dir.glob("*.tmp"):  # an ack write cut short; the old ack.json stands
            tmp.unlink(missing_ok=True)
        for first_seq, path in self._segment_files():
            try:
                data = path.read_bytes()
            except OSError as exc:  # left in place: perhaps readable another time
                log.error("spool %s: cannot read %s, skipping it: %s", self.dir, path.name, exc)
                continue
            seg = _Segment(path, size=len(data))
            for record in scan_records(data):
                if record is None:
                    self.corrupt += 1
                    continue
                offset, length, seq = record
                if seq <= self._acked:
                    continue  # delivered
                if seq <= last_seq:
                    self.corrupt += 1  # out of order: not written by this spool's agent
                    continue
                last_seq = seq
                seg.add(seq, offset, length)
            if seg.seqs:
                self._segments.append(seg)
                self._bytes += seg.size
                self._count += len(seg.seqs)
            else:
                path.unlink(missing_ok=True)  # all delivered (or nothing readable)
        self._next_seq = last_seq + 1
        if self._count or self.corrupt:
            log.log(logging.WARNING if self.corrupt else logging.INFO,
                    "spool %s: resuming %d unsent samples (%.1f MiB in %d segments); %d damaged records skipped",
                    self.dir, self._count, self._bytes / MIB, len(self._segments), self.corrupt)
        self._enforce_cap()

    def _segment_files(self) -> list[tuple[int, Path]]:
        found = []
        for path in self.dir.glob(f"{SEGMENT_PREFIX}*{SEGMENT_SUFFIX}"):
            digits = path.name[len(SEGMENT_PREFIX):-len(SEGMENT_SUFFIX)]
            if digits.isdigit():
                found.append((int(digits), path))
        return sorted(found)

    def _load_ack(self) -> int:
        path = self.dir / ACK_FILE
        try:
            acked = json.loads(path.read_bytes())["acked_seq"]
            if type(acked) is not int:
                raise ValueError(f"acked_seq {acked!r} is not an integer")
            return acked
        except FileNotFoundError:
            return -1
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # Everything left is sent again: duplicates are harmless, losses are not.
            log.warning("spool %s: ignoring unreadable %s (%s); resending all spooled samples", self.dir, ACK_FILE, exc)
            return -1

    # --- SampleQueue ----------------------------------------------------------------------------

    def put(self, sample: Sample) -> None:
        try:
            payload = json.dumps(sample, separators=(",", ":"), default=json_default).encode()
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
            seg.add(seq, offset, len(payload))
            self._count += 1
            if offset < 0:
                self._pinned[seq] = payload
            else:
                _remember(self._payloads, seq, payload, self.cache_size)
            _remember(self._samples, seq, sample, self.cache_size)
            self._enforce_cap()

    def peek(self, n: int) -> list[tuple[int, Sample]]:
        return self._peek(n, self._sample)

    def peek_encoded(self, n: int) -> list[tuple[int, bytes]]:
        """Like peek(), with each sample as its JSON (what json.dumps(sample) with
        agent.sample.json_default and compact separators gives): the pusher splices these into
        the request body as they are."""
        return self._peek(n, self._payload)

    def _peek(self, n: int, get: Callable[[_Segment, int], object | None]) -> list:
        out: list = []
        if n < 1:
            return out
        with self._lock:
            for seg in self._segments:
                for i in seg.pending():
                    seq = seg.seqs[i]
                    if seq in self._skipped:
                        continue
                    item = get(seg, i)
                    if item is None:  # unreadable: never to be sent
                        self._skip(seq)
                        continue
                    out.append((seq, item))
                    if len(out) >= n:
                        return out
        return out

    def ack(self, upto_seq: int) -> None:
        with self._lock:
            upto_seq = min(upto_seq, self._next_seq - 1)  # never ack a seq not yet given out
            if upto_seq <= self._acked:
                return
            self._acked = upto_seq
            while self._segments:
                seg = self._segments[0]
                end = bisect.bisect_right(seg.seqs, upto_seq, seg.start)
                for i in range(seg.start, end):
                    self._forget(seg.seqs[i])
                seg.start = end
                if end < len(seg.seqs) or seg is self._active:
                    break
                self._delete(self._segments.popleft())
            save_now = self._clock() >= self._ack_due
        if save_now:  # else the sync thread saves it within fsync_interval
            self._save_ack()

    def __len__(self) -> int:
        return self._count

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def close(self) -> None:
        """fsync, save the ack position, release the directory. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop_sync.set()
        self._syncer.join()
        with self._lock:
            self._close_active()
            for reader in self._readers.values():
                reader.close()
            self._readers.clear()
        self.sync()
        self._lock_file.close()  # releases the flock

    def __enter__(self) -> DiskSpool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- writing --------------------------------------------------------------------------------

    def _segment_for(self, length: int, seq: int) -> _Segment:
        seg = self._active
        if seg is None:
            return self._open_segment(seq)
        if self._file is None:
            return self._open_segment(seq) if self._clock() >= self._disk_retry_at else seg
        if seg.size > 0 and seg.size + HEADER.size + length > self.segment_bytes:
            return self._open_segment(seq)
        return seg

    def _open_segment(self, first_seq: int) -> _Segment:
        self._close_active()
        seg = _Segment(self.dir / segment_name(first_seq))
        try:
            self._file = open(seg.path, "xb")
            self._dir_dirty = True  # the new name must survive a power cut too
        except OSError as exc:
            self._write_failed(exc)
        self._segments.append(seg)
        self._active = seg
        return seg

    def _append(self, seg: _Segment, seq: int, payload: bytes) -> int:
        """Write one record; its offset, or -1 when the disk refused it."""
        if self._file is None:
            return -1
        record = encode_record(seq, payload)
        try:
            self._file.write(record)
            self._file.flush()  # in the kernel now: safe from a crash of this process
            self._dirty = True
        except OSError as exc:
            # Whatever part of the record reached the file is a torn tail, skipped on reading.
            self._write_failed(exc)
            self._resize(seg, _file_size(seg.path, seg.size))
            return -1
        offset = seg.size
        self._resize(seg, seg.size + len(record))
        return offset

    def _close_active(self) -> None:
        """Close the segment being written; the sync thread fsyncs it (a duplicate descriptor)."""
        if self._file is None:
            return
        file, self._file = self._file, None
        try:
            file.flush()
            if self._dirty:
                self._unsynced_fds.append(os.dup(file.fileno()))
        except OSError as exc:
            self._write_failed(exc)
        finally:
            self._dirty = False
            try:
                file.close()
            except OSError:
                pass

    # --- fsync, off the sampling thread ---------------------------------------------------------

    def _sync_loop(self) -> None:
        while not self._stop_sync.wait(self.fsync_interval):
            self.sync()

    def sync(self) -> None:
        """fsync everything written so far. A background thread calls this every
        `fsync_interval` seconds, so that a slow disk holds up that thread, never put()."""
        with self._lock:
            fds, self._unsynced_fds = self._unsynced_fds, []
            if self._dirty and self._file is not None:
                fds.append(os.dup(self._file.fileno()))
                self._dirty = False
            dir_dirty, self._dir_dirty = self._dir_dirty, False
        for fd in fds:
            try:
                os.fsync(fd)
            except OSError as exc:
                log.warning("spool %s: fsync failed: %s", self.dir, exc)
            finally:
                os.close(fd)
        if dir_dirty:
            try:
                _fsync_dir(self.dir)
            except OSError as exc:
                log.warning("spool %s: fsync of the directory failed: %s", self.dir, exc)
        self._save_ack()

    def _write_failed(self, exc: OSError) -> None:
        self.write_errors += 1
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None
        now = self._clock()
        self._disk_retry_at = now + DISK_RETRY_S
        if self._error_logged_at is None or now - self._error_logged_at >= ERROR_LOG_EVERY_S:
            self._error_logged_at = now
            log.error("spool %s: cannot write (%s); keeping samples in memory (up to %d) and retrying every %gs "
                      "(%d write errors so far)", self.dir, exc, self.max_memory_samples, DISK_RETRY_S, self.write_errors)

    def _save_ack(self) -> None:
        """Persist the ack position if it moved. Runs outside the main lock (it fsyncs), on the
        pusher's thread or the sync thread, never on the sampler's."""
        with self._ack_lock:
            acked = self._acked
            if acked == self._acked_saved:
                return
            path, tmp = self.dir / ACK_FILE, self.dir / (ACK_FILE + ".tmp")
            try:
                with open(tmp, "wb") as f:
                    f.write(json.dumps({"acked_seq": acked}).encode())
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)  # readers see the old file or the new one, never a mix
            except OSError as exc:
                log.warning("spool %s: cannot save the ack position (%s); a restart would resend some samples",
                            self.dir, exc)
                return
            finally:
                self._ack_due = self._clock() + self.ack_interval
            self._acked_saved = acked

    # --- bounds ---------------------------------------------------------------------------------

    def _enforce_cap(self) -> None:
        dropped = 0
        while self._bytes > self.max_bytes and self._segments and self._segments[0] is not self._active:
            seg = self._segments.popleft()
            for i in seg.pending():
                if seg.seqs[i] not in self._skipped:
                    dropped += 1
                self._forget(seg.seqs[i])
            self._delete(seg)
        while len(self._pinned) > self.max_memory_samples:
            self._skip(next(iter(self._pinned)))
            dropped += 1
        if dropped:
            self.dropped += dropped
            self._unlogged_drops += dropped
            now = self._clock()
            if self._drop_logged_at is None or now - self._drop_logged_at >= ERROR_LOG_EVERY_S:
                self._drop_logged_at = now
                log.warning("spool %s full (cap %.1f MiB): dropped the %d oldest unsent samples (%d dropped in all)",
                            self.dir, self.max_bytes / MIB, self._unlogged_drops, self.dropped)
                self._unlogged_drops = 0

    # --- index and cache ------------------------------------------------------------------------

    def _skip(self, seq: int) -> None:
        """Take an unsent seq out of the count for good (it stays in the index until acked)."""
        if seq not in self._skipped:
            self._skipped.add(seq)
            self._count -= 1
        self._drop_cached(seq)

    def _forget(self, seq: int) -> None:
        """An index entry leaves (acked, or its segment deleted)."""
        if seq in self._skipped:
            self._skipped.discard(seq)
        else:
            self._count -= 1
        self._drop_cached(seq)

    def _drop_cached(self, seq: int) -> None:
        self._pinned.pop(seq, None)
        self._payloads.pop(seq, None)
        self._samples.pop(seq, None)

    def _resize(self, seg: _Segment, size: int) -> None:
        self._bytes += size - seg.size
        seg.size = size

    def _delete(self, seg: _Segment) -> None:
        reader = self._readers.pop(seg.path, None)
        if reader is not None:
            reader.close()
        self._bytes -= seg.size
        try:
            seg.path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("spool %s: cannot delete %s: %s", self.dir, seg.path.name, exc)

    def _sample(self, seg: _Segment, i: int) -> Sample | None:
        seq = seg.seqs[i]
        sample = self._samples.get(seq)
        if sample is None:
            payload = self._payload(seg, i)
            if payload is None:
                return None
            try:
                sample = sample_from_dict(json.loads(payload))
            except ValueError as exc:  # passed its CRC, so written so by a buggy agent: skip it
                return self._damaged(seg, seq, f"not a sample: {exc}")
            _remember(self._samples, seq, sample, self.cache_size)
        return sample

    def _payload(self, seg: _Segment, i: int) -> bytes | None:
        seq, offset, length = seg.seqs[i], seg.offsets[i], seg.lengths[i]
        payload = self._pinned.get(seq)
        if payload is None:
            payload = self._payloads.get(seq)
        if payload is not None:
            return payload
        if offset < 0:
            return self._damaged(seg, seq, "kept only in memory, and lost")
        try:
            data = self._read_bytes(seg, offset, HEADER.size + length)
        except OSError as exc:
            return self._damaged(seg, seq, str(exc))
        if record_at(data, 0) != (length, seq):
            return self._damaged(seg, seq, "damaged on disk")
        payload = data[HEADER.size:]
        _remember(self._payloads, seq, payload, self.cache_size)
        return payload

    def _damaged(self, seg: _Segment, seq: int, problem: str) -> None:
        """Count and log an unreadable record (None, for the caller to return)."""
        self.corrupt += 1
        log.error("spool %s: skipping sample seq %d in %s: %s", self.dir, seq, seg.path.name, problem)

    def _read_bytes(self, seg: _Segment, offset: int, n: int) -> bytes:
        reader = self._readers.get(seg.path)
        if reader is None:
            while len(self._readers) >= 4:  # only the head few segments are ever read
                self._readers.pop(next(iter(self._readers))).close()
            reader = self._readers[seg.path] = open(seg.path, "rb")
        reader.seek(offset)
        return reader.read(n)


def _remember(cache: dict, seq: int, item: object, size: int) -> None:
    cache[seq] = item
    if len(cache) > size:
        del cache[next(iter(cache))]


def _file_size(path: Path, default: int) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return default


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
