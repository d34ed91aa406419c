"""Giving the memory of a burst back to the system (issue #12).

After a burst of large batches the collector's heap is mostly free again, but glibc's malloc
keeps what it freed for later, in every arena the threads used (the event loop, the writer,
the large-body decoder, the detector): the process stayed at its peak RSS, idle. malloc_trim(0)
hands the free pages of every arena back; the collector calls it every few seconds (it walks
the free lists only: milliseconds). Elsewhere than glibc this does nothing."""

from __future__ import annotations

import ctypes


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim  # noqa: B018 (absent from musl and non-Linux libcs)
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _glibc()


def trim() -> bool:
    """Return freed heap memory to the system; True if some was."""
    if _LIBC is None:
        return False
    return bool(_LIBC.malloc_trim(0))
