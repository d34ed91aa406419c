"""The alert outbox: deliveries pending and the age of the oldest, per receiver."""

from __future__ import annotations

from collections.abc import Callable

from agent.exposition import Family
from server.metrics.families.snapshot import Snapshot


class AlertOutbox:
    def __init__(self, receivers: Callable[[], list[str]]):
        """`receivers`: the configured receivers' names, which are shown at 0 with nothing pending."""
        self.receivers = receivers

    def collect(self, snap: Snapshot) -> list[Family]:
        pending = Family("laggard_alert_deliveries_pending", "gauge", "Alert deliveries waiting to be sent (or retried), by receiver.",
                         ("receiver",))
        oldest = Family("laggard_alert_oldest_pending_age_seconds", "gauge", "Age of the oldest undelivered alert, by receiver.",
                        ("receiver",))
        if not snap.selection.takes_unclustered:
            return [pending, oldest]
        for name in sorted(set(self.receivers()) | set(snap.pending)):
            n, first = snap.pending.get(name, (0, None))
            pending.add((name,), n)
            oldest.add((name,), 0.0 if first is None else max(0.0, snap.now - first))
        return [pending, oldest]
