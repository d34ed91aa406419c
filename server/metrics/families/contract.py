"""What every family collector is: one method from the scrape's snapshot to its families."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from agent.exposition import Family
from server.metrics.families.snapshot import Snapshot


class FamilyCollector(Protocol):
    def collect(self, snap: Snapshot) -> Iterable[Family]:
        """The families of this group, for the snapshot's selection; no database reads."""
        ...
