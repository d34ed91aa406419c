"""Turning per-instant findings into lasting conditions: open after k of the last n judged
instants, resolve after m consecutive clean ones spanning at least `clear_after_s` of sample
time (hysteresis), so one fault is one episode."""

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
    recent: deque = field(init=False)
    is_open: bool = False
    severity: str | None = None
    clean_run: int = 0
    first_clean_ts: float | None = None

    def __post_init__(self) -> None:
        self.recent = deque(maxlen=self.n)

    def step(self, ts: float, finding: Finding | None) -> Change | None:
        self.recent.append((ts, finding))
        if finding is None:
            return self._clean(ts)
        self.clean_run, self.first_clean_ts = 0, None
        if self.is_open:
            if finding.severity == "critical" and self.severity != "critical":
                self.severity = "critical"
                return Escalated(finding)
            return None
        hits = [t for t, f in self.recent if f is not None]
        if finding.immediate or len(hits) >= self.k:
            self.is_open, self.severity = True, finding.severity
            onset = hits[0] if finding.onset is None else min(finding.onset, hits[0])
            return Opened(finding, onset=onset, detected_at=ts)
        return None

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
            return Resolved(resolved_at)
        return None

    @property
    def idle(self) -> bool:
        """Nothing to remember: no open episode and no recent hit."""
        return not self.is_open and all(f is None for _, f in self.recent)
