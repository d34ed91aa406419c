"""Turning per-instant findings into lasting conditions: open after k of the last n judged
instants once the run of hits spans `open_after_s` of sample time (a transient is not a
straggler: at 1 s sampling three slow samples span 2 s), resolve after m consecutive clean ones
spanning at least `clear_after_s` of sample time (hysteresis), so one fault is one episode.
A finding may ask for a longer run than `open_after_s` (Finding.open_after_s), or for its
last hits to come in a row (Finding.in_row).

A run of hits survives up to n - k clean instants in a row (a fault that shows only in some
phases of a training step stays one run); n - k + 1 clean instants end it."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from server.detect.model import Finding


@dataclass(frozen=True, slots=True)
class Opened:
    finding: Finding
    onset: float
    detected_at: float


@dataclass(frozen=True, slots=True)
class Escalated:
    finding: Finding


@dataclass(frozen=True, slots=True)
class Resolved:
    resolved_at: float


Change = Opened | Escalated | Resolved


@dataclass
class Condition:
    """One (entity, cause): its recent verdicts and whether an episode is open."""

    n: int
    k: int
    clear_after: int
    clear_after_s: float = 0.0
    open_after_s: float = 0.0
    recent: deque = field(init=False)
    is_open: bool = False
    severity: str | None = None
    clean_run: int = 0
    first_clean_ts: float | None = None
    run_start: float | None = None  # first hit of the current run
    misses_in_row: int = 0
    row_after: float = float("-inf")  # hits at or before it make no row with later ones (interrupt)

    def __post_init__(self) -> None:
        self.recent = deque(maxlen=self.n)

    def step(self, ts: float, finding: Finding | None) -> Change | None:
        self.recent.append((ts, finding))
        if finding is None:
            self.misses_in_row += 1
            if self.misses_in_row > self.n - self.k:
                self.run_start = None
            return self._clean(ts)
        self.misses_in_row = 0
        if self.run_start is None:
            self.run_start = ts
        self.clean_run, self.first_clean_ts = 0, None
        if self.is_open:
            if finding.severity == "critical" and self.severity != "critical":
                self.severity = "critical"
                return Escalated(finding)
            return None
        hits = [t for t, f in self.recent if f is not None]
        if finding.immediate:
            return self._open(finding, ts, hits[0])
        wanted = self.open_after_s if finding.open_after_s is None else max(self.open_after_s, finding.open_after_s)
        if len(hits) >= self.k and ts - self.run_start >= wanted and self._in_row() >= finding.in_row:
            return self._open(finding, ts, min(hits[0], self.run_start))
        return None

    def interrupt(self, ts: float) -> None:
        """An instant that neither confirms nor clears (an idle GPU, a port of an idle node): it
        counts as no miss, but the hits on either side of it are not in a row. A port whose
        counter its driver refreshes every 2 s reads low, high, low at 5 s; its low reading
        before a checkpoint and the one after made two in a row (a false episode)."""
        self.row_after = ts

    def _in_row(self) -> int:
        """Hits at the latest instants, without a miss or an interruption between."""
        n = 0
        for ts, f in reversed(self.recent):
            if f is None or ts <= self.row_after:
                break
            n += 1
        return n

    def _open(self, finding: Finding, ts: float, first_hit: float) -> Opened:
        self.is_open, self.severity = True, finding.severity
        onset = first_hit if finding.onset is None else min(finding.onset, first_hit)
        return Opened(finding, onset=onset, detected_at=ts)

    def _clean(self, ts: float) -> Change | None:
        if not self.is_open:
            return None
        if self.clean_run == 0:
            self.first_clean_ts = ts
        self.clean_run += 1
        if self.clean_run >= self.clear_after and ts - self.first_clean_ts >= self.clear_after_s:
            resolved_at = self.first_clean_ts
            self.is_open, self.severity, self.clean_run, self.first_clean_ts = False, None, 0, None
            self.recent.clear()
            self.run_start, self.misses_in_row = None, 0
            return Resolved(resolved_at)
        return None

    @property
    def idle(self) -> bool:
        """Nothing to remember: no open episode and no recent hit."""
        return not self.is_open and all(f is None for _, f in self.recent)
