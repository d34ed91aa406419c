"""dcgm-exporter's GPU families from each GPU's latest sample, with its XID gauge: the series a
node's own dcgm-exporter would serve, labelled as if it did (FLEET_DCGM_LABELS)."""

from __future__ import annotations

from agent.dcgm_fields import FLEET_DCGM_LABELS, XID_FIELD, dcgm_families
from agent.exposition import Family
from server.metrics.families.snapshot import Snapshot


class DcgmGpuReadings:
    def __init__(self, enabled: bool, extra_series: bool):
        """`enabled`, `extra_series`: MetricsSettings.dcgm_series and dcgm_extra_series."""
        self.enabled, self.extra_series = enabled, extra_series

    def collect(self, snap: Snapshot) -> list[Family]:
        if not self.enabled:
            return []
        items = []
        xid = Family(XID_FIELD.name, XID_FIELD.type, XID_FIELD.help, FLEET_DCGM_LABELS)
        last_xid = snap.last_xid
        for g in snap.gpus:
            is_lost = bool(g.sample["lost"])
            items.append((g.dcgm_labels, {} if is_lost else g.sample))  # a lost GPU's readings are not shown
            if g.gpu_id in last_xid:
                xid.add(g.dcgm_labels, last_xid[g.gpu_id])
        return dcgm_families(items, extra=self.extra_series, labelnames=FLEET_DCGM_LABELS) + [xid]
