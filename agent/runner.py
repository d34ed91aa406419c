"""The sampling loop: one Sample per tick on a fixed cadence, handed to a sink.

Ticks sit on wall-clock multiples of the interval (12:00:00, :05, :10 ...) so that samples
from different nodes line up for cross-node comparison, and the schedule does not drift
with the time a read takes. A tick that is missed (a slow read, a paused VM) is skipped
rather than made up in a burst.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Callable, Protocol

from agent.sample import GpuSample, NicSample, Sample
from agent.sysfs.infiniband import DEFAULT_SYSFS_ROOT, read_ib_ports

log = logging.getLogger(__name__)


class GpuSource(Protocol):
    def read(self, ts: float) -> list[GpuSample]: ...


class SampleSink(Protocol):
    def submit(self, sample: Sample) -> None: ...


def collect(ts: float, source: GpuSource | None, read_nics: Callable[[float], list[NicSample]],
            failing: set[str] | None = None) -> Sample:
    """One sample; a failing reader costs its half of the sample, not the whole.

    `failing` (kept by the caller across samples) logs a reader that keeps failing once,
    and again when it recovers, instead of once per tick.
    """
    gpus = _guarded("GPU", lambda: source.read(ts), failing) if source is not None else None
    nics = _guarded("NIC", lambda: read_nics(ts), failing)
    return Sample(ts=ts, gpus=gpus or [], nics=nics or [])


def _guarded(what: str, read: Callable[[], list], failing: set[str] | None) -> list | None:
    try:
        result = read()
    except Exception:
        if failing is None or what not in failing:
            log.exception("%s read failed%s", what, "" if failing is None else "; logged again when it recovers")
        if failing is not None:
            failing.add(what)
        return None
    if failing is not None and what in failing:
        failing.discard(what)
        log.info("%s read recovered", what)
    return result


class Runner:
    def __init__(
        self,
        source: GpuSource | None,
        sink: SampleSink,
        *,
        interval: float = 5.0,
        sysfs_root: str = DEFAULT_SYSFS_ROOT,
        read_nics: Callable[[float], list[NicSample]] | None = None,
        stop: threading.Event | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not interval > 0:
            raise ValueError("interval must be positive")
        self.source = source
        self.sink = sink
        self.interval = interval
        self.read_nics = read_nics or (lambda ts: read_ib_ports(sysfs_root))
        self.stop = stop or threading.Event()
        self.clock = clock
        self.ticks = 0
        self._failing: set[str] = set()
        self.skipped = 0

    def run(self, max_ticks: int | None = None) -> None:
        """Sample until `stop` is set (or `max_ticks` samples were taken)."""
        # Tick k is at k * interval: an integer index keeps timestamps on the grid
        # instead of accumulating float error.
        k = self._first_tick()
        while not self.stop.is_set():
            wait = k * self.interval - self.clock()
            if wait > self.interval:  # the wall clock stepped back: re-align, don't stall
                k = self._first_tick()
                continue
            if self.stop.wait(max(0.0, wait)):
                break
            self.sink.submit(collect(k * self.interval, self.source, self.read_nics, self._failing))
            self.ticks += 1
            if max_ticks is not None and self.ticks >= max_ticks:
                break
            k += 1
            late = self.clock() - k * self.interval
            if late > self.interval / 2:  # a little late: sample now; very late: skip
                missed = math.ceil((late - self.interval / 2) / self.interval)
                self.skipped += missed
                k += missed
                log.warning("sampling fell %.1fs behind; skipped %d tick(s)", late, missed)

    def _first_tick(self) -> int:
        return math.ceil(self.clock() / self.interval)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name="runner", daemon=True)
        thread.start()
        return thread
