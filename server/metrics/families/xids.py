"""laggard_gpu_xid_last_timestamp_seconds: when each GPU last reported each XID code. A counter
cannot alert on a GPU's first XID: its series is born at 1, and increase() over a series' first
sample is 0 (issue #16); "the last one was less than 10 minutes ago" can."""

from __future__ import annotations

from agent.exposition import Family
from server.metrics.families.labels import GPU_LABELS, NO_WORKLOAD, XID_LAST_HORIZON_S
from server.metrics.families.snapshot import Snapshot


class XidLast:
    def collect(self, snap: Snapshot) -> list[Family]:
        fam = Family("laggard_gpu_xid_last_timestamp_seconds", "gauge",
                     f"Time (epoch seconds) of the GPU's latest XID of this code, for XIDs of the last {XID_LAST_HORIZON_S // 3600:.0f} h.",
                     (*GPU_LABELS, "xid"))
        rows = [r for r in snap.xid_last if snap.selection.takes_node(r[0], r[1])]
        for cluster, node, index, uuid, xid, ts, gpu_id in sorted(rows):
            fam.add((cluster, node, str(index), uuid, snap.workloads.get(gpu_id, NO_WORKLOAD)[1], str(xid)), ts)
        return [fam]
