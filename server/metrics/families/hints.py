"""The scheduler hints as series: each node's action and capacity (and, for the per-GPU series,
each GPU's capacity), from the hints document where the app hands one in, else derived here from
the open episodes."""

from __future__ import annotations

from agent.exposition import Family
from server.metrics.families.snapshot import Snapshot

ACTIONS = ("ok", "rebalance", "avoid", "drain")
PERF_CAUSES = frozenset({"thermal", "power", "clock", "hw_slowdown"})


class NodeHints:
    def collect(self, snap: Snapshot) -> list[Family]:
        action = Family("laggard_node_action", "gauge", "1 for the node's current scheduling action (ok, rebalance, avoid, drain), else 0.",
                        ("cluster", "node", "action"))
        capacity = Family("laggard_node_capacity_ratio", "gauge",
                          "Expected throughput of the node relative to a healthy one (its slowest GPU or link), 0 to 1.", ("cluster", "node"))
        for (cluster, name), (act, cap) in sorted(node_actions(snap).items()):
            if not snap.selection.takes_node(cluster, name):
                continue
            for a in ACTIONS:
                action.add((cluster, name, a), int(a == act))
            capacity.add((cluster, name), cap)
        return [action, capacity]


def node_actions(snap: Snapshot) -> dict[tuple[str, str], tuple[str, float]]:
    out = {(n[1], n[2]): ("ok", 1.0) for n in snap.nodes.values()}
    if snap.hints is not None:
        for node in snap.hints.get("nodes", ()):
            out[(node["cluster"], node["node"])] = (node["action"], float(node["capacity"]))
        return out
    caps = derived_capacity(snap)
    for ep in snap.active:
        key = (ep["cluster"], ep["node"])
        act, cap = out.get(key, ("ok", 1.0))
        worst = "drain" if ep["severity"] == "critical" else "avoid"
        if ACTIONS.index(worst) > ACTIONS.index(act):
            act = worst
        out[key] = (act, cap)
    for (cluster, node, _gpu), cap in caps.items():
        act, current = out.get((cluster, node), ("ok", 1.0))
        out[(cluster, node)] = (act, min(current, cap))
    return out


def gpu_capacity(snap: Snapshot) -> dict[tuple[str, str, int], float]:
    """Each GPU's capacity by (cluster, node, index): the hints' where there are hints, else
    derived from the open episodes. A GPU not in it has capacity 1."""
    if snap.hints is None:
        return derived_capacity(snap)
    return {(n["cluster"], n["node"], g["index"]): float(g["capacity"]) for n in snap.hints.get("nodes", ()) for g in n.get("gpus", ())}


def derived_capacity(snap: Snapshot) -> dict[tuple[str, str, int], float]:
    """Without hints: a GPU's capacity from its open episodes' evidence (SM clock against the
    peers' for the performance causes; 0 for a lost GPU)."""
    caps: dict[tuple[str, str, int], float] = {}
    for ep in snap.active:
        if ep["gpu"] is None:
            continue
        key = (ep["cluster"], ep["node"], ep["gpu"])
        evidence = ep["evidence"] or {}
        cap = 1.0
        if ep["cause"] == "lost":
            cap = 0.0
        elif ep["cause"] in PERF_CAUSES and isinstance(evidence.get("clock_deviation"), (int, float)):
            cap = min(1.0, max(0.0, 1.0 + evidence["clock_deviation"]))
        caps[key] = min(caps.get(key, 1.0), cap)
    return caps
