"""thermal: a GPU slowed by heat.

Flags (precedence in _perf.triage):
- the HW thermal slowdown bit (critical; counts without peers, and on a GPU that is not busy
  while the HW slowdown bit shows the clock is being held);
- the SW thermal slowdown bit on a busy GPU (a warning, critical once the clock is
  clock_critical_drop below the peers' or the HW slowdown bit is also set);
- no thermal bit, but a busy GPU whose SM clock is below its peers' while it runs hot_delta_c
  hotter than their median. Temperatures are compared with the peers, never with a fixed
  limit: a warm afternoon raises the whole group together. Under one identical load real GPUs
  spread a few degrees (realdata gpu-burn 8×A100: 58-62 °C at the end of the run; RTX 4090 busy
  pair 72/76 °C), so 10 °C above the median is well outside normal.
"""

from __future__ import annotations

from server.detect.model import HW_SLOWDOWN, HW_THERMAL, SW_THERMAL, Finding, PeerStats, Window
from server.detect.rules import _perf
from server.detect.settings import DetectionSettings

CAUSE = "thermal"


def evaluate(window: Window, peers: PeerStats | None, cfg: DetectionSettings) -> Finding | None:
    perf = _perf.triage(window.latest, peers, cfg)
    if perf is None or perf.cause != CAUSE:
        return None
    bits = perf.obs.clocks_event_reasons or 0
    if perf.trigger == _perf.HOT:
        hotter = perf.temps[0] - perf.temps[1]
        return _perf.finding(perf, _perf.severity_by_drop(perf, cfg), f"no thermal bit, running {hotter:.0f} °C hotter than peers")
    named = [name for bit, name in ((HW_THERMAL, "HW thermal slowdown"), (SW_THERMAL, "SW thermal slowdown")) if bits & bit]
    critical = perf.trigger == _perf.HW_THERMAL_BIT or bits & HW_SLOWDOWN
    severity = "critical" if critical else _perf.severity_by_drop(perf, cfg)
    return _perf.finding(perf, severity, " + ".join(named))
