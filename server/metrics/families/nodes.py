"""Node liveness: each node's newest sample time, and per cluster the nodes reporting and stale."""

from __future__ import annotations

from collections import defaultdict

from agent.exposition import Family
from server.metrics.families.snapshot import Snapshot


class NodeLiveness:
    def __init__(self, node_stale_after_s: float):
        self.node_stale_after_s = node_stale_after_s

    def collect(self, snap: Snapshot) -> list[Family]:
        seen = Family("laggard_node_last_seen_timestamp_seconds", "gauge", "Sample time of the node's newest sample (Unix seconds).",
                      ("cluster", "node"))
        reporting: dict[str, int] = defaultdict(int)
        stale: dict[str, int] = defaultdict(int)
        sel = snap.selection
        for _, cluster, name, _labels, _agent, last_seen in snap.nodes.values():
            if sel.takes_node(cluster, name):
                seen.add((cluster, name), last_seen)
            if snap.now - last_seen <= self.node_stale_after_s:
                reporting[cluster] += 1
            else:
                stale[cluster] += 1
        rep = Family("laggard_nodes_reporting", "gauge", "Nodes whose newest sample is recent (within node_stale_after_s).", ("cluster",))
        st = Family("laggard_nodes_stale", "gauge", "Known nodes whose newest sample is older than node_stale_after_s.", ("cluster",))
        for cluster in sorted({n[1] for n in snap.nodes.values()}):
            if sel.takes_cluster_level(cluster):
                rep.add((cluster,), reporting[cluster])
                st.add((cluster,), stale[cluster])
        return [seen, rep, st]
