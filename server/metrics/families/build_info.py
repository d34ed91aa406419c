"""laggard_build_info: the collector's version."""

from __future__ import annotations

from agent.exposition import Family
from server import __version__
from server.metrics.families.snapshot import Snapshot


class BuildInfo:
    def collect(self, snap: Snapshot) -> list[Family]:
        build = Family("laggard_build_info", "gauge", "The collector's version.", ("version",))
        if snap.selection.takes_unclustered:
            build.add((__version__,), 1)
        return [build]
