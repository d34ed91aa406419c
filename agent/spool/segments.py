"""Segment files: seg-<first seq, 20 digits>.log, append-only, oldest first.

One segment at a time is written (SegmentWriter); every record is handed to the kernel before
put() returns, so a crash of the agent process (kill -9, OOM kill) loses nothing. fsync is left
to the caller's background thread (take_unsynced, then fsync_files), so that a slow disk never
delays a sample. An opened spool never appends to an old segment: it starts a new one, so a
record torn by a power cut stays at the end of its file.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from agent.spool.directory import fsync_dir

log = logging.getLogger(__name__)

SEGMENT_PREFIX, SEGMENT_SUFFIX = "seg-", ".log"
DISK_RETRY_S = 10.0
ERROR_LOG_EVERY_S = 60.0


def segment_name(first_seq: int) -> str:
    return f"{SEGMENT_PREFIX}{first_seq:020d}{SEGMENT_SUFFIX}"


def segment_files(directory: Path) -> list[tuple[int, Path]]:
    """(first seq, path) of the directory's segment files, oldest first."""
    found = []
    for path in directory.glob(f"{SEGMENT_PREFIX}*{SEGMENT_SUFFIX}"):
        digits = path.name[len(SEGMENT_PREFIX):-len(SEGMENT_SUFFIX)]
        if digits.isdigit():
            found.append((int(digits), path))
    return sorted(found)


def delete_segment(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        log.warning("spool %s: cannot delete %s: %s", path.parent, path.name, exc)


def file_size(path: Path, default: int) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return default


class SegmentWriter:
    """The segment file being appended to, and what was written to it (or to the ones before)
    that is not fsynced yet. When the disk refuses a write, the file is closed and `is_open`
    stays False until the caller, at `retry_due`, opens a new segment. Not thread-safe: the
    spool's lock guards it."""

    def __init__(self, directory: Path, *, clock: Callable[[], float], now: float, memory_samples: int) -> None:
        self.dir = directory
        self.errors = 0  # writes (and opens) the disk refused
        self._clock = clock
        self._memory_samples = memory_samples  # only for the log: how many samples wait in memory instead
        self._file: BinaryIO | None = None
        self._dirty = False  # written since the last fsync
        self._dir_dirty = False  # a new name in the directory since the last fsync
        self._unsynced_fds: list[int] = []  # closed segments not yet fsynced (duplicated descriptors)
        self._retry_at = now
        self._error_logged_at: float | None = None

    @property
    def is_open(self) -> bool:
        return self._file is not None

    def retry_due(self) -> bool:
        return self._clock() >= self._retry_at

    def open(self, path: Path) -> None:
        """Close the current segment and start a new file (never an existing one)."""
        self.close()
        try:
            self._file = open(path, "xb")
            self._dir_dirty = True  # the new name must survive a power cut too
        except OSError as exc:
            self._failed(exc)

    def append(self, record: bytes) -> bool:
        """Write one record to the open segment; False when the disk refused it."""
        if self._file is None:
            return False
        try:
            self._file.write(record)
            self._file.flush()  # in the kernel now: safe from a crash of this process
            self._dirty = True
        except OSError as exc:
            # Whatever part of the record reached the file is a torn tail, skipped on reading.
            self._failed(exc)
            return False
        return True

    def close(self) -> None:
        """Close the segment being written; it is fsynced later through a duplicate descriptor."""
        if self._file is None:
            return
        file, self._file = self._file, None
        try:
            file.flush()
            if self._dirty:
                self._unsynced_fds.append(os.dup(file.fileno()))
        except OSError as exc:
            self._failed(exc)
        finally:
            self._dirty = False
            try:
                file.close()
            except OSError:
                pass

    def take_unsynced(self) -> tuple[list[int], bool]:
        """The descriptors to fsync (the caller closes them) and whether the directory needs it too."""
        fds, self._unsynced_fds = self._unsynced_fds, []
        if self._dirty and self._file is not None:
            fds.append(os.dup(self._file.fileno()))
            self._dirty = False
        dir_dirty, self._dir_dirty = self._dir_dirty, False
        return fds, dir_dirty

    def _failed(self, exc: OSError) -> None:
        self.errors += 1
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None
        now = self._clock()
        self._retry_at = now + DISK_RETRY_S
        if self._error_logged_at is None or now - self._error_logged_at >= ERROR_LOG_EVERY_S:
            self._error_logged_at = now
            log.error("spool %s: cannot write (%s); keeping samples in memory (up to %d) and retrying every %gs "
                      "(%d write errors so far)", self.dir, exc, self._memory_samples, DISK_RETRY_S, self.errors)


def fsync_files(directory: Path, fds: list[int], dir_dirty: bool) -> None:
    """fsync and close what SegmentWriter.take_unsynced handed out; failures are logged, not raised."""
    for fd in fds:
        try:
            os.fsync(fd)
        except OSError as exc:
            log.warning("spool %s: fsync failed: %s", directory, exc)
        finally:
            os.close(fd)
    if dir_dirty:
        try:
            fsync_dir(directory)
        except OSError as exc:
            log.warning("spool %s: fsync of the directory failed: %s", directory, exc)


class SegmentReader:
    """Open files of the segments records are read back from: only the head few ever are."""

    MAX_OPEN = 4

    def __init__(self) -> None:
        self._files: dict[Path, BinaryIO] = {}

    def read(self, path: Path, offset: int, n: int) -> bytes:
        reader = self._files.get(path)
        if reader is None:
            while len(self._files) >= self.MAX_OPEN:
                self._files.pop(next(iter(self._files))).close()
            reader = self._files[path] = open(path, "rb")
        reader.seek(offset)
        return reader.read(n)

    def forget(self, path: Path) -> None:
        """Close it (its segment is being deleted)."""
        reader = self._files.pop(path, None)
        if reader is not None:
            reader.close()

    def close(self) -> None:
        for reader in self._files.values():
            reader.close()
        self._files.clear()
