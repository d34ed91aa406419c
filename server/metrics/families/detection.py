"""The detector's state: how far behind it judges each cluster, the batches it has not read, and
(PostgreSQL) which replica holds each cluster's lease."""

from __future__ import annotations

import math

from agent.exposition import Family
from server.metrics.families.snapshot import Snapshot
from server.store.detector_state import bucket


class DetectorState:
    def collect(self, snap: Snapshot) -> list[Family]:
        lag = Family("laggard_detection_lag_seconds", "gauge",
                     "Wall-clock time now minus the sample time the detector has judged up to, per cluster.", ("cluster",))
        sel = snap.selection
        for key, value in sorted(snap.progress.items()):
            if key.startswith("judged_until:") and math.isfinite(value) and sel.takes_cluster_level(key.removeprefix("judged_until:")):
                lag.add((key.removeprefix("judged_until:"),), max(0.0, snap.now - value))
        backlog = Family("laggard_detection_backlog_batches", "gauge", "Committed batches the detector has not read yet.")
        if sel.takes_unclustered:
            backlog.add((), snap.backlog or 0)
        if snap.holders is None:
            return [lag, backlog]
        holder = Family("laggard_detection_lease_holder", "gauge",
                        "1 per cluster: the replica (application_name of its lock session) whose detector judges it; "
                        "replica=\"\" at 0 while no replica holds the cluster's lease (PostgreSQL).", ("cluster", "replica"))
        for cluster in sorted({n[1] for n in snap.nodes.values()}):
            if not sel.takes_cluster_level(cluster):
                continue
            name = snap.holders.get(bucket(cluster))
            holder.add((cluster, name or ""), 0 if name is None else 1)
        return [lag, backlog, holder]
