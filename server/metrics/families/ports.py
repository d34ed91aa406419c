"""The network ports' families (InfiniBand/RoCE counters and state) from each port's latest sample."""

from __future__ import annotations

from agent.dcgm_fields import nic_families
from agent.exposition import Family
from server.metrics.families.snapshot import Snapshot


class PortSeries:
    def collect(self, snap: Snapshot) -> list[Family]:
        return nic_families(snap.nic_items)
