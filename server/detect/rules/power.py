"""power: a GPU held back by power — the HW power brake, an enforced power limit below its
peers', or the SW power cap holding its clock below its peers'.

- HW power brake bit: an external brake signal (PSU, BMC) forces the clock down; critical,
  judged without peers. Counts on a GPU that is not busy only while the HW slowdown bit says
  the clock is held (realdata gpud 535.161.08: node-wide brake, 86 of 1980 MHz).
- Enforced power limit power_limit_drop below the busy peers' median: a misconfigured or
  derated GPU; a warning (critical when its clock is clock_critical_drop below the peers').
- SW power cap bit with the SM clock below the peers': the GPU needs more power than its
  peers for the same clock (or is capped lower). The bit alone is routine and never flags:
  realdata RTX 4090 (gpud out.1/out.2) shows it on busy GPUs at 435-446 W of 450 W, and a
  busy neighbour at 405 W without it, all within ~5 % of their median clock. Judged only
  where most busy peers are on the cap too, and opened only once it has lasted
  power_capped_open_after_s: GPUs that share a label but not their work (a replica or a
  sweep run per GPU) trade the lowest capped clock among themselves within minutes.
"""

from __future__ import annotations

from server.detect.model import SW_POWER_CAP, Finding, PeerStats, Window
from server.detect.rules import _perf
from server.detect.rules._common import pct
from server.detect.settings import DetectionSettings

CAUSE = "power"


def evaluate(window: Window, peers: PeerStats | None, cfg: DetectionSettings) -> Finding | None:
    perf = _perf.triage(window.latest, peers, cfg)
    if perf is None or perf.cause != CAUSE:
        return None
    if perf.trigger == _perf.HW_POWER_BRAKE_BIT:
        return _perf.finding(perf, "critical", "HW power brake")
    if perf.trigger == _perf.POWER_LIMIT:
        lim = perf.power_limit
        why = f"power limit {lim.value:.0f} W vs peer median {lim.peer_median:.0f} W ({pct(lim.deviation)})"
        return _perf.finding(perf, _perf.severity_by_drop(perf, cfg), why, metric="power_limit_w")
    return _perf.finding(perf, _perf.severity_by_drop(perf, cfg), _cap(perf.obs.clocks_event_reasons))


def _cap(bits: int | None) -> str:
    if bits is None:
        return "on its power cap (by its draw: reasons not reported)"
    return "SW power cap" if bits & SW_POWER_CAP else "on its power cap (by its draw; SW power cap bit not set)"
