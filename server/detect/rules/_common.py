"""Helpers shared by the rules: labels and number formatting, comparisons with the peer
group, and counter increases over a window of sample time."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from server.detect.model import GpuObs, PeerStats, Robust, Window
from server.detect.settings import DetectionSettings

# Comparisons on counts built from float rates (count = rate × seconds) lose a few ulps.
_EPS = 1e-6


def gpu_label(obs: GpuObs) -> str:
    return f"GPU {obs.index}"


def pct(fraction: float) -> str:
    """-0.2893 → "-29%"."""
    return f"{fraction * 100:+.0f}%"


def rnd(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def gbps(bytes_per_s: float) -> str:
    """Bytes/s as a short GB/s figure for summaries."""
    value = bytes_per_s / 1e9
    return f"{value:.0f} GB/s" if value >= 10 else f"{value:.2g} GB/s"


def at_least(count: float, threshold: float) -> bool:
    return count + _EPS >= threshold


# --- peers ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VsPeers:
    """One reading against the peer median: deviation as a fraction (negative = lower) and the
    robust z-score; `low` when both tests of the rule using it pass."""

    value: float
    peer_median: float
    deviation: float
    z: float
    low: bool


def clock_vs_peers(obs: GpuObs, peers: PeerStats | None, cfg: DetectionSettings) -> VsPeers | None:
    """SM clock against the busy peers'. Compared as a fraction of the peers' max clock, so a
    GPU whose own max clock is lower (a clock cap) is still seen as slower; value and
    peer_median are in MHz."""
    if peers is None or peers.sm_clock_ratio is None or obs.sm_clock_mhz is None:
        return None
    peer_max = peers.sm_clock_max_mhz.median if peers.sm_clock_max_mhz is not None else obs.sm_clock_max_mhz
    ratio_median = peers.sm_clock_ratio.median
    if not peer_max or ratio_median <= 0:
        return None
    ratio = obs.sm_clock_mhz / peer_max
    deviation = ratio / ratio_median - 1.0
    z = peers.sm_clock_ratio.z(ratio, cfg.clock_noise_floor)
    low = deviation <= -cfg.clock_drop and z <= -cfg.clock_z
    return VsPeers(obs.sm_clock_mhz, ratio_median * peer_max, deviation, z, low)


# A throughput figure alone (no error, no link down) opens an episode only after this many
# hits in a row: a slow link is slow at every sample, while a counter its driver refreshed
# late reads low, then high (Finding.in_row).
THROUGHPUT_IN_ROW = 2


def throughput_vs_peers(value: float | None, stats: Robust | None, *, min_median: float, drop: float,
                        cfg: DetectionSettings) -> VsPeers | None:
    """Bytes/s against the peers': None when either side is unknown or the peers themselves
    move too little to judge (a compute phase, a quiet fabric)."""
    if value is None or stats is None or stats.median < min_median:
        return None
    deviation = value / stats.median - 1.0
    z = stats.z(value, cfg.bw_noise_floor * stats.median)
    return VsPeers(value, stats.median, deviation, z, deviation <= -drop and z <= -cfg.bw_z)


def temp_vs_peers(obs: GpuObs, peers: PeerStats | None) -> tuple[float, float] | None:
    if obs.temp_c is None or peers is None or peers.temp_c is None:
        return None
    return obs.temp_c, peers.temp_c.median


def power_limit_vs_peers(obs: GpuObs, peers: PeerStats | None, cfg: DetectionSettings) -> VsPeers | None:
    """Enforced power limit against the peers' median; `low` when it is power_limit_drop below."""
    if obs.power_limit_w is None or peers is None or peers.power_limit_w is None or peers.power_limit_w.median <= 0:
        return None
    median = peers.power_limit_w.median
    deviation = obs.power_limit_w / median - 1.0
    return VsPeers(obs.power_limit_w, median, deviation, 0.0, deviation <= -cfg.power_limit_drop)


# --- counters over a window -----------------------------------------------------------


def increase(window: Window, attr: str, seconds: float) -> float:
    """How much a counter grew within the last `seconds` of sample time, from the per-second
    rates the observations carry. Each rate covers the interval since the sample before it;
    an interval that straddles the window's start counts only for its part inside."""
    items = window.items
    if not items:
        return 0.0
    start = items[-1].ts - seconds
    typical = _typical_interval_of(window)
    total = 0.0
    tail, before = _tail(items, start)
    prev_ts: float | None = before
    for obs in tail:
        rate = getattr(obs, attr)
        if obs.ts > start and rate:
            begin = prev_ts if prev_ts is not None else (obs.ts - typical if typical else None)
            if begin is not None:
                total += max(rate, 0.0) * (obs.ts - max(begin, start))
        prev_ts = obs.ts
    return total


def new_in_window(window: Window, attr: str, seconds: float) -> int:
    """Sum of a per-sample increase (not a rate) over the last `seconds` of sample time."""
    items = window.items
    if not items:
        return 0
    start = items[-1].ts - seconds
    return sum(getattr(o, attr) or 0 for o in _tail(items, start)[0])


def _tail(items, start: float) -> tuple[list, float | None]:
    """The observations after `start`, oldest first, and the time of the one before them.
    Windows hold their observations in sample-time order (each GPU's samples are observed
    in order), so the scan stops at the first older one instead of reading all 120."""
    tail = []
    for obs in reversed(items):
        if obs.ts <= start:
            tail.reverse()
            return tail, obs.ts
        tail.append(obs)
    tail.reverse()
    return tail, None


def _typical_interval_of(window: Window) -> float | None:
    # Several rules ask for it at each instant: computed once per window content. A window
    # only ever appends, and each append puts a new object last (and, when full, drops the first).
    items = window.items
    key = (len(items), id(items[0]), id(items[-1]))
    cached = window._typical
    if cached is None or cached[0] != key:
        cached = window._typical = (key, _typical_interval(items))
    return cached[1]


def _typical_interval(items) -> float | None:
    if len(items) < 2:
        return None
    gaps = sorted(b.ts - a.ts for a, b in zip(items, list(items)[1:]))
    return gaps[len(gaps) // 2]


def lead(evidence: dict[str, Any], metric: str, value: Any, **headline: Any) -> None:
    """Make `metric` the finding's headline number unless an earlier, graver problem already is:
    metric, value and the headline extras (peer_median, deviation, expected) go together."""
    if "metric" not in evidence:
        evidence.update(metric=metric, value=value, **headline)


def drop_none(evidence: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in evidence.items() if v is not None}
