"""CPython tuned for the latency of small requests beside large ones (issue #12).

Every thread of the collector (event loop, writer, large-body decoder, detector) runs Python
under one GIL. Two things made a well-behaved agent's push wait on a hostile one's work:

- The GIL's switch interval: a thread that wants the GIL waits up to this long before the
  one holding it is asked to let go, and a push changes hands a dozen times on its way to
  the writer and back. At Python's 5 ms the fleet's p99 beside maximum-size batches was 0.5 s.
- The cyclic GC's full collections: each walks every tracked object with the GIL held, and
  the modules, app and settings built at start are ~200,000 of them (~0.1 s). Frozen once
  started, they are never walked again."""

from __future__ import annotations

import gc
import sys
import threading

_frozen = threading.Event()


def set_switch_interval(seconds: float) -> None:
    """The GIL switch interval; 0 leaves Python's own (5 ms)."""
    if seconds > 0:
        sys.setswitchinterval(seconds)


def freeze_once() -> bool:
    """Move what exists now out of the cyclic GC's reach, once per process (a process starting
    apps again and again, as tests do, would otherwise never collect the earlier ones' cycles).
    True if this call froze."""
    if _frozen.is_set():
        return False
    _frozen.set()
    gc.collect()
    gc.freeze()
    return True
