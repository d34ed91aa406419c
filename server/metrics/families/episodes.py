"""laggard_straggler_active: the open straggler episodes."""

from __future__ import annotations

from collections import defaultdict

from agent.exposition import Family
from server.metrics.families.snapshot import Snapshot


class ActiveStragglers:
    def collect(self, snap: Snapshot) -> list[Family]:
        active = Family("laggard_straggler_active", "gauge",
                        "Open straggler episodes (1 per GPU and cause; a node-level cause such as an IB port counts its open episodes, "
                        "gpu empty; job: the job attributed to the GPU when the episode opened, else empty).",
                        ("cluster", "node", "gpu", "cause", "severity", "job_name"))
        counts: dict[tuple[str, ...], int] = defaultdict(int)
        for ep in snap.active:
            if not snap.selection.takes_node(ep["cluster"], ep["node"]):
                continue
            evidence = ep["evidence"] if isinstance(ep["evidence"], dict) else {}
            job = evidence.get("job")
            counts[(ep["cluster"], ep["node"], "" if ep["gpu"] is None else str(ep["gpu"]), ep["cause"], ep["severity"],
                    job if isinstance(job, str) else "")] += 1
        for labels, n in sorted(counts.items()):
            active.add(labels, n)
        return [active]
