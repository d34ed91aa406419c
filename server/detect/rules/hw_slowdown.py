"""hw_slowdown: the HW slowdown bit without the more specific HW thermal or HW power brake bit
(those go to thermal and power): the hardware is cutting the clock, e.g. fast-trigger
over-current protection or an external slowdown signal. A hardware fault: critical, judged
without peers and whether or not the GPU is busy (NVML reports idleness with its own bit;
HW slowdown is never a power-saving state)."""

from __future__ import annotations

from server.detect.model import Finding, PeerStats, Window
from server.detect.rules import _perf
from server.detect.settings import DetectionSettings

CAUSE = "hw_slowdown"


def evaluate(window: Window, peers: PeerStats | None, cfg: DetectionSettings) -> Finding | None:
    perf = _perf.triage(window.latest, peers, cfg)
    if perf is None or perf.cause != CAUSE:
        return None
    return _perf.finding(perf, "critical", "HW slowdown (no thermal or power-brake bit)")
