"""Episode → action and capacity: pure functions of one episode's cause, severity and evidence.

Capacity is the expected throughput of the GPU (or node) relative to a healthy peer of the same
model, 0–1, read from the evidence the detector stored (docs/rebalancing.md has the table):

- thermal, power, clock, hw_slowdown: the SM clock against the busy peers' median
  (1 + clock_deviation), else against the peers' clock, else against the GPU's own max clock
  (a hardware bit judged without peers). Compute-bound work scales with the SM clock.
- nvlink, network: the link's bandwidth ratio r (links up / total, port rate or throughput
  against the peers'), turned into a step-time share with Amdahl's law:
  1 / ((1 - f) + f / r), f = comm_fraction.
- pcie: the same with the link's lanes × generation ratio and f = io_fraction.
- anything without a ratio in its evidence: fallback_capacity[severity].
- drain: 0, whatever the evidence (take it out).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from server.hints.settings import ACTIONS, RANK, Action, HintSettings

PERF_CAUSES = frozenset({"thermal", "power", "clock", "hw_slowdown"})


def action_for(cause: str, severity: str, cfg: HintSettings, table: Mapping[str, Action] | None = None) -> Action:
    """The action the table gives a cause at a severity ('cause:severity', then 'cause')."""
    table = cfg.action_table() if table is None else table
    for key in (f"{cause}:{severity}", cause):
        if key in table:
            return table[key]
    return cfg.unknown_cause_action


def worst(actions: Iterable[Action]) -> Action:
    return max(actions, key=RANK.__getitem__, default="ok")


def amdahl(ratio: float, fraction: float) -> float:
    """Throughput left when `fraction` of the work runs at `ratio` of its healthy speed."""
    if ratio <= 0:
        return 0.0 if fraction > 0 else 1.0
    return 1.0 / ((1.0 - fraction) + fraction / min(ratio, 1.0))


def capacity_for(cause: str, severity: str, evidence: Mapping[str, Any] | None, action: Action, cfg: HintSettings) -> float:
    """Expected throughput relative to a healthy peer, 0–1 (rounded to 3 places)."""
    if action == "drain":
        return 0.0
    ev = evidence or {}
    value: float | None
    if cause in PERF_CAUSES:
        value = _clock_ratio(ev)
    elif cause == "nvlink":
        ratio = _nvlink_ratio(ev)
        value = None if ratio is None else amdahl(ratio, cfg.comm_fraction)
    elif cause == "network":
        ratio = _network_ratio(ev)
        value = None if ratio is None else amdahl(ratio, cfg.comm_fraction)
    elif cause == "pcie":
        ratio = _pcie_ratio(ev)
        value = None if ratio is None else amdahl(ratio, cfg.io_fraction)
    else:
        value = None
    if value is None:
        value = cfg.fallback_capacity.get(severity, cfg.fallback_capacity.get("critical", 0.7))  # type: ignore[call-overload]
    return round(min(max(value, 0.0), 1.0), 3)


def _num(ev: Mapping[str, Any], key: str) -> float | None:
    value = ev.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _clock_ratio(ev: Mapping[str, Any]) -> float | None:
    deviation = _num(ev, "clock_deviation")
    if deviation is None and ev.get("metric") == "sm_clock_mhz":
        deviation = _num(ev, "deviation")
    if deviation is not None:
        return 1.0 + deviation
    clock = _num(ev, "sm_clock_mhz")
    for reference in ("peer_sm_clock_mhz", "sm_clock_max_mhz"):
        ref = _num(ev, reference)
        if clock is not None and ref:
            return clock / ref
    return None


def _nvlink_ratio(ev: Mapping[str, Any]) -> float | None:
    up, total = _num(ev, "links_up"), _num(ev, "links_total")
    if up is not None and total and up < total:
        return up / total
    deviation = _num(ev, "nvlink_deviation")
    return None if deviation is None else 1.0 + deviation


def _network_ratio(ev: Mapping[str, Any]) -> float | None:
    if ev.get("metric") == "state":  # port not ACTIVE
        return 0.0
    rate, peer_rate = _num(ev, "rate_gbps"), _num(ev, "peer_rate_gbps")
    if rate is not None and peer_rate and rate < peer_rate:
        return rate / peer_rate
    bps, peer_bps = _num(ev, "bps"), _num(ev, "peer_bps")
    if bps is not None and peer_bps:
        return bps / peer_bps
    return None


def _pcie_ratio(ev: Mapping[str, Any]) -> float | None:
    width, width_max = _num(ev, "pcie_width"), _num(ev, "pcie_width_max")
    gen, gen_max = _num(ev, "pcie_gen"), _num(ev, "pcie_gen_max")
    ratio = 1.0
    if width is not None and width_max:
        ratio *= min(width / width_max, 1.0)
    if gen is not None and gen_max:
        ratio *= 2.0 ** min(gen - gen_max, 0.0)  # each generation doubles the lane rate
    return None if ratio >= 1.0 else ratio


__all__ = ["ACTIONS", "action_for", "amdahl", "capacity_for", "worst"]
