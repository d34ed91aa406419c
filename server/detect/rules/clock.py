"""clock: a busy GPU whose SM clock is well below its busy peers' with nothing to explain it —
no thermal, power or HW slowdown bit, not hotter than its peers, its power limit no lower.

"Well below" is both clock_drop (8 %) under the peer median of the clock as a fraction of max
and clock_z robust standard deviations under it. Real busy GPUs of one model sit closer than
that: gpu-burn on 8×A100 spreads 1.7 % in Gflop/s (realdata superbench), and the busy RTX 4090s
of the gpud dumps run 2520-2775 MHz, within ~5 % of their median, even under the SW power cap.
Needs peers: without them no clock is "low". Bits that do not explain a lower clock
(applications clocks, sync boost, display clocks) are named in the summary; a GPU that reports
no reasons at all is said to, not to have none (its power or thermal cause cannot be told).
"""

from __future__ import annotations

from server.detect.model import APP_CLOCKS, DISPLAY_CLOCKS, SYNC_BOOST, Finding, PeerStats, Window, reason_names
from server.detect.rules import _perf
from server.detect.settings import DetectionSettings

CAUSE = "clock"


def evaluate(window: Window, peers: PeerStats | None, cfg: DetectionSettings) -> Finding | None:
    perf = _perf.triage(window.latest, peers, cfg)
    if perf is None or perf.cause != CAUSE:
        return None
    if perf.obs.clocks_event_reasons is None:  # NVML_ERROR_NOT_SUPPORTED on some vGPU and older drivers
        return _perf.finding(perf, _perf.severity_by_drop(perf, cfg), "clock-event reasons not reported")
    other = reason_names(perf.obs.clocks_event_reasons & (APP_CLOCKS | SYNC_BOOST | DISPLAY_CLOCKS))
    why = "no clock-event reason explains it" if not other else f"only {', '.join(other)} active"
    return _perf.finding(perf, _perf.severity_by_drop(perf, cfg), why)
