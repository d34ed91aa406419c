"""pcie: the PCIe link trained below its max generation or width, or replays rising at a
sustained rate.

- Width below max: critical, busy or not. Lanes are not dropped to save power: every idle GPU
  in the realdata gpud dumps (RTX 4090 at Gen1, H100, A10, TITAN V) keeps x16 of x16.
- Generation below max: critical, but only while the GPU is busy — an idle GPU steps its link
  down to save power (realdata: idle RTX 4090s at Gen1 of Gen4, busy ones back at Gen4).
- Replays: their increase over rate_window_s of sample time ≥ pcie_replays_in_window; a
  warning. Totals mean nothing: healthy H100s of the gpud dumps carry 43-120 replays since reset.
"""

from __future__ import annotations

from server.detect.model import Finding, PeerStats, Window
from server.detect.rules._common import at_least, gpu_label, increase, lead
from server.detect.settings import DetectionSettings

CAUSE = "pcie"


def evaluate(window: Window, peers: PeerStats | None, cfg: DetectionSettings) -> Finding | None:
    obs = window.latest
    if obs.lost:
        return None
    narrow = obs.pcie_width is not None and obs.pcie_width_max is not None and obs.pcie_width < obs.pcie_width_max
    slow_gen = obs.busy and obs.pcie_gen is not None and obs.pcie_gen_max is not None and obs.pcie_gen < obs.pcie_gen_max
    replays = increase(window, "pcie_replay_per_s", cfg.rate_window_s)
    rising = at_least(replays, cfg.pcie_replays_in_window)
    if not (narrow or slow_gen or rising):
        return None

    parts = []
    evidence: dict = {}
    if narrow or slow_gen:
        parts.append(f"PCIe link Gen{obs.pcie_gen} x{obs.pcie_width}, max Gen{obs.pcie_gen_max} x{obs.pcie_width_max}")
        metric = "pcie_width" if narrow else "pcie_gen"
        lead(evidence, metric, getattr(obs, metric), expected=getattr(obs, metric + "_max"))
    if rising:
        parts.append(f"{round(replays)} PCIe replays in {cfg.rate_window_s:.0f} s")
        lead(evidence, "pcie_replays_in_window", round(replays))
        evidence.update(replays_in_window=round(replays, 1), window_s=cfg.rate_window_s)
    evidence.update(pcie_gen=obs.pcie_gen, pcie_gen_max=obs.pcie_gen_max, pcie_width=obs.pcie_width,
                    pcie_width_max=obs.pcie_width_max, util_gpu_pct=obs.util_gpu_pct)
    severity = "critical" if (narrow or slow_gen) else "warning"
    return Finding(cause=CAUSE, severity=severity, summary=f"{gpu_label(obs)} " + "; ".join(parts),
                   evidence={k: v for k, v in evidence.items() if v is not None})
