"""lost: the agent reports the GPU lost (NVML: GPU is lost / unreachable) — its readings are
all missing, so no other rule can judge it and this one alone reports it (any XID of the same
sample, e.g. 79 "fallen off the bus" or 119 "GSP RPC timeout", goes into its evidence).
A condition, not an event: it opens with persistence. (A GPU that stops reporting altogether
while its node still reports is the engine's own "lost" finding.)"""

from __future__ import annotations

from server.detect.model import Finding, PeerStats, Window
from server.detect.rules._common import gpu_label
from server.detect.rules.xid import describe
from server.detect.settings import DetectionSettings

CAUSE = "lost"


def evaluate(window: Window, peers: PeerStats | None, cfg: DetectionSettings) -> Finding | None:
    obs = window.latest
    if not obs.lost:
        return None
    xids = sorted(set(obs.xids))
    summary = f"{gpu_label(obs)} lost: NVML reports it unreachable; drain node {obs.node} and reset or replace the GPU"
    if xids:
        summary += "; " + ", ".join(describe(x) for x in xids)
    evidence = {"metric": "lost", "value": True, "node": obs.node, "uuid": obs.uuid}
    if xids:
        evidence["xids"] = xids
    return Finding(cause=CAUSE, severity="critical", summary=summary, evidence=evidence)
