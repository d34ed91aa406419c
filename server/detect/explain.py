"""Evidence every finding carries besides its rule's own numbers: the window it was judged on,
the peers it was compared with (where, how many, their median and spread for the finding's
metric, and why they were fit to compare), and the workload it slows where one is attributed."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from server.detect.model import Finding, NicPeerStats, PeerStats, Robust, Window

# The finding's headline metric → the peer statistic it was compared with.
_STAT_OF_METRIC = {
    "sm_clock_mhz": "sm_clock_ratio", "power_limit_w": "power_limit_w", "temp_c": "temp_c", "nvlink_bps": "nvlink_bps",
    "bps": "bps", "rate_gbps": "rate_gbps", "xmit_wait_per_s": "xmit_wait_per_s",
}


def explain(finding: Finding, window: Window, peers: PeerStats | NicPeerStats | None) -> Finding:
    obs = window.latest
    items = window.items
    before = items[-2].ts if len(items) >= 2 else None
    evidence: dict[str, Any] = dict(finding.evidence)
    # Gauges are the reading at `to`; rates and counter increases cover `from`..`to`.
    evidence["window"] = {"from": before, "to": obs.ts}
    if peers is not None:
        evidence["peers"] = _peers(peers, obs.node, evidence.get("metric"))
    workload = getattr(obs, "workload", None)
    if workload:
        # Whose job it slows, first: alerts, hints and drain reasons quote the summary.
        evidence["workload"] = workload
        if getattr(obs, "job", None):
            evidence["job"] = obs.job
        return replace(finding, evidence=evidence, summary=f"{workload}: {finding.summary}")
    return replace(finding, evidence=evidence)


def _peers(peers: PeerStats | NicPeerStats, node: str, metric: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "scope": f"node {node}, same peer group, same instant",
        "count": peers.size,
        # Steady: every member compared was busy at this instant, read by the same agent at the
        # same moment of the job's step, its counters over the same interval.
        "steady": f"{peers.size} busy members sampled together",
    }
    stat: Robust | None = getattr(peers, _STAT_OF_METRIC.get(metric or "", ""), None)
    if stat is not None:
        out.update(stat=_STAT_OF_METRIC[metric], median=round(stat.median, 4), mad=round(stat.mad, 4), n=stat.n)
    return out
