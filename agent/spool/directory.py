"""The spool directory: one agent at a time (an flock), and fsync of the directory itself."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import BinaryIO

LOCK_FILE = "lock"


class SpoolError(Exception):
    """The spool directory cannot be used (not writable, or another agent holds it)."""


def lock_directory(directory: Path) -> BinaryIO:
    """Create the directory if need be and flock it; closing the returned file releases it."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        lock_file = open(directory / LOCK_FILE, "ab")
    except OSError as exc:
        raise SpoolError(f"cannot use spool directory {directory}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock_file.close()
        raise SpoolError(f"spool directory {directory} is in use by another agent") from None
    if not os.access(directory, os.W_OK):
        lock_file.close()
        raise SpoolError(f"spool directory {directory} is not writable")
    return lock_file


def fsync_dir(directory: Path) -> None:
    """Make the names created in it (a new segment) survive a power cut."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
