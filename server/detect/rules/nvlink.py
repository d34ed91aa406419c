"""nvlink: NVLink links down, link errors rising at a sustained rate, or NVLink throughput far
below peers doing the same work. One finding carries every one of them that holds.

- Links down (nvlink_links_up < nvlink_links_total): critical, busy or not — links do not go
  down to save power (realdata: gpud nvidia-smi.nvlink.status.a100, 12 links up per A100).
- CRC + replay + recovery errors summed over rate_window_s of sample time ≥
  nvlink_errors_in_window: a warning. A CRC error now and then is normal and never reaches it.
- Throughput: the GPU busy, the busy peers' median at least nvlink_min_bps (a compute phase
  moves next to nothing, and a whole group going quiet together is no fault), this GPU
  nvlink_bw_drop below that median and bw_z robust deviations under it (a group whose members
  do different work spreads wide and is not judged). A warning. Not judged when the GPU itself
  is slowed (any thermal/power/hw_slowdown/clock verdict): a slow GPU also moves less over
  NVLink, and that fault is reported by its own rule. Nor when another busy peer moves as
  little (within shared_tol of the median): GPUs that talk to each other move the same
  bytes, so a shared low figure is their work's (the GPUs of a tensor-parallel replica with
  fewer requests than the others: bench/fleetgen/serving.py), whereas a GPU's own links slow
  it alone. Nor when it moves next to nothing (below nvlink_min_bps) over links that are up
  and clean: it is in no NVLink conversation (a single-GPU replica beside tensor-parallel
  ones); links that fail show as down or erroring. Nor when a busy peer's figure is unknown
  at that instant (not read, a counter reset): the one that would share it may be that one.
"""

from __future__ import annotations

from server.detect.model import Finding, PeerStats, Window
from server.detect.rules import _perf
from server.detect.rules._common import THROUGHPUT_IN_ROW, at_least, drop_none, gbps, gpu_label, increase, lead, pct, rnd, throughput_vs_peers
from server.detect.settings import DetectionSettings

CAUSE = "nvlink"
_COUNTERS = (("CRC", "nvlink_crc_per_s"), ("replay", "nvlink_replay_per_s"), ("recovery", "nvlink_recovery_per_s"))


def evaluate(window: Window, peers: PeerStats | None, cfg: DetectionSettings) -> Finding | None:
    obs = window.latest
    if obs.lost:
        return None
    parts: list[str] = []
    evidence: dict = {}
    label = gpu_label(obs)

    up, total = obs.nvlink_links_up, obs.nvlink_links_total
    links_down = up is not None and total is not None and 0 <= up < total
    if links_down:
        parts.append(f"NVLink {up} of {total} links up")
        lead(evidence, "nvlink_links_up", up, expected=total)

    counts = {name: increase(window, attr, cfg.rate_window_s) for name, attr in _COUNTERS}
    errors = sum(counts.values())
    if at_least(errors, cfg.nvlink_errors_in_window):
        detail = ", ".join(f"{name} {round(n)}" for name, n in counts.items() if round(n))
        parts.append(f"{round(errors)} NVLink errors in {cfg.rate_window_s:.0f} s ({detail})")
        lead(evidence, "nvlink_errors_in_window", round(errors))
        evidence.update(errors_in_window={name: round(n, 1) for name, n in counts.items()}, window_s=cfg.rate_window_s)

    bw = None
    if obs.busy and peers is not None:
        bw = throughput_vs_peers(obs.nvlink_bps, peers.nvlink_bps, min_median=cfg.nvlink_min_bps, drop=cfg.nvlink_bw_drop, cfg=cfg)
    if bw is not None and bw.low and (bw.value < cfg.nvlink_min_bps
                                      or peers.nvlink_bps.near(bw.value, cfg.shared_tol * bw.peer_median) > 1
                                      or peers.nvlink_bps.n < peers.size):
        bw = None  # in no NVLink conversation, sharing its low figure with a peer (or maybe: a peer's unknown)
    slow = bw is not None and bw.low and _perf.triage(obs, peers, cfg) is None
    throughput = None
    if slow or (parts and bw is not None and bw.low):
        throughput = f"NVLink {gbps(bw.value)} vs peer median {gbps(bw.peer_median)} ({pct(bw.deviation)})"
        parts.append(throughput)
        lead(evidence, "nvlink_bps", bw.value, peer_median=bw.peer_median, deviation=rnd(bw.deviation))
        evidence.update(peer_nvlink_bps=bw.peer_median, nvlink_deviation=rnd(bw.deviation), nvlink_z=rnd(bw.z, 2))
    if not parts:
        return None
    evidence.update(nvlink_bps=obs.nvlink_bps, links_up=up, links_total=total, util_gpu_pct=obs.util_gpu_pct)
    severity = "critical" if links_down else "warning"
    return Finding(cause=CAUSE, severity=severity, summary=f"{label} " + "; ".join(parts), evidence=drop_none(evidence),
                   in_row=THROUGHPUT_IN_ROW if parts == [throughput] else 1)
