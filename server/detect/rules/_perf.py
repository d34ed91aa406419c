"""One triage for the performance causes (thermal, power, hw_slowdown, clock), so that one
slow GPU gets exactly one of them. The four rules share it and each reports only its own
cause; the precedence lives here, in one place:

  1. HW thermal slowdown bit                                  → thermal      (critical)
  2. HW power brake bit                                       → power        (critical)
  3. SW thermal slowdown bit, GPU busy                        → thermal
  4. HW slowdown bit (neither of the specific bits above)     → hw_slowdown  (critical)
  -- from here on the GPU must be busy and have peers --
  5. enforced power limit below the peers'                    → power
  -- SM clock below the peers' with the SW power cap bit while most peers run below their
     cap: the cap answering more work than they have, not a slower GPU → nothing
  6. SM clock below the peers' and far hotter than them       → thermal
  7. SM clock below the peers' with the SW power cap bit      → power
  8. SM clock below the peers', nothing explains it           → clock
  (6 and 7 on a capped GPU open only after power_capped_open_after_s: Perf.open_after_s)

Bits 1, 2 and 4 are hardware signals, so they count without peers. They also count on a GPU
that is not busy, but only while the HW slowdown bit says the hardware is holding the clock
down: the real 8×H100 node-wide power brake (realdata gpud 535.161.08: HW Slowdown + HW
Power Brake on all 8, SM 86 of 1980 MHz, 0 % utilisation) is a fault, whereas a lone HW
power brake bit on a GPU at 0 % utilisation and full clock (gpud 535.183.01, GPU 75:00.0,
next to SW thermal and SW power cap bits, 1980 MHz, 39 °C) slows nothing and is not judged.
SW thermal counts only on a busy GPU. The SW power cap bit alone never counts: busy GPUs show
it routinely (realdata RTX 4090 out.1/out.2: 445 W of 450 W with the bit, 405 W without).
Nor does a capped GPU's lower clock next to peers mostly below their cap: GPUs that share a
model and a label but not their work (an inference replica per GPU, a sweep of single-GPU
runs) differ exactly so, the busiest on the cap at a lower clock (bench/fleetgen/serving.py).
A GPU that needs more power than its peers for the same work is still seen where they are
capped too (step 7): the GPUs of a synchronous job are in the same phase of its step at one
instant, all of them on the cap in a power-bound compute phase.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from server.detect.model import (
    HW_POWER_BRAKE,
    HW_SLOWDOWN,
    HW_THERMAL,
    SW_POWER_CAP,
    SW_THERMAL,
    Finding,
    GpuObs,
    PeerStats,
    Severity,
    reason_names,
)
from server.detect.rules._common import (
    VsPeers,
    clock_vs_peers,
    drop_none,
    gpu_label,
    pct,
    power_limit_vs_peers,
    rnd,
    temp_vs_peers,
)
from server.detect.settings import DetectionSettings

# What decided the cause (kept in the evidence as "trigger").
HW_THERMAL_BIT = "hw_thermal_bit"
HW_POWER_BRAKE_BIT = "hw_power_brake_bit"
SW_THERMAL_BIT = "sw_thermal_bit"
HW_SLOWDOWN_BIT = "hw_slowdown_bit"
POWER_LIMIT = "power_limit_below_peers"
HOT = "clock_below_peers_and_hot"
SW_POWER_CAPPED = "clock_below_peers_and_sw_power_cap"
UNEXPLAINED = "clock_below_peers_unexplained"


@dataclass(frozen=True, slots=True)
class Perf:
    cause: str
    trigger: str
    obs: GpuObs
    clock: VsPeers | None
    temps: tuple[float, float] | None
    power_limit: VsPeers | None
    open_after_s: float | None = None  # Finding.open_after_s


def triage(obs: GpuObs, peers: PeerStats | None, cfg: DetectionSettings) -> Perf | None:
    if obs.lost:
        return None
    bits = obs.reasons  # the power cap inferred from the draw where the reasons are not reported
    busy = obs.busy
    held = busy or bool(bits & HW_SLOWDOWN)  # hardware bits matter while they hold the clock
    clock = clock_vs_peers(obs, peers, cfg) if busy else None
    temps = temp_vs_peers(obs, peers)
    limit = power_limit_vs_peers(obs, peers, cfg) if busy else None

    def verdict(cause: str, trigger: str) -> Perf:
        return Perf(cause, trigger, obs, clock, temps, limit)

    if bits & HW_THERMAL and held:
        return verdict("thermal", HW_THERMAL_BIT)
    if bits & HW_POWER_BRAKE and held:
        return verdict("power", HW_POWER_BRAKE_BIT)
    if bits & SW_THERMAL and busy:
        return verdict("thermal", SW_THERMAL_BIT)
    if bits & HW_SLOWDOWN:
        return verdict("hw_slowdown", HW_SLOWDOWN_BIT)
    if not busy:
        return None
    return _below_peers(verdict("", ""), bits, peers, cfg)


def _below_peers(perf: Perf, bits: int, peers: PeerStats | None, cfg: DetectionSettings) -> Perf | None:
    """Steps 5-8: a busy GPU against its peers (`perf` carries the comparisons, no cause yet)."""
    if perf.power_limit is not None and perf.power_limit.low:
        return replace(perf, cause="power", trigger=POWER_LIMIT)
    if perf.clock is None or not perf.clock.low:
        return None
    hot = perf.temps is not None and perf.temps[0] - perf.temps[1] >= cfg.hot_delta_c
    if bits & SW_POWER_CAP:
        if peers is None or peers.power_capped < cfg.power_capped_share:
            return None  # the cap answering more work than its peers have
        # Capped below capped peers, hot or not: chronic where it is a fault.
        perf = replace(perf, open_after_s=cfg.power_capped_open_after_s)
        return replace(perf, cause="thermal", trigger=HOT) if hot else replace(perf, cause="power", trigger=SW_POWER_CAPPED)
    return replace(perf, cause="thermal", trigger=HOT) if hot else replace(perf, cause="clock", trigger=UNEXPLAINED)


def severity_by_drop(perf: Perf, cfg: DetectionSettings) -> Severity:
    """Performance deviations are warnings unless the clock fell by clock_critical_drop."""
    if perf.clock is not None and perf.clock.deviation <= -cfg.clock_critical_drop:
        return "critical"
    return "warning"


def finding(perf: Perf, severity: Severity, why: str, *, metric: str = "sm_clock_mhz") -> Finding:
    """The Finding for a triaged GPU: clock first, then why, then temperature and power."""
    obs = perf.obs
    parts = [_clock_text(perf), why]
    if perf.temps is not None:
        parts.append(f"{perf.temps[0]:.0f} °C vs {perf.temps[1]:.0f} °C")
    elif obs.temp_c is not None:
        parts.append(f"{obs.temp_c:.0f} °C")
    if perf.trigger in (HW_POWER_BRAKE_BIT, SW_POWER_CAPPED, HW_SLOWDOWN_BIT) and obs.power_w is not None:
        limit = f" of {obs.power_limit_w:.0f} W limit" if obs.power_limit_w else ""
        parts.append(f"drawing {obs.power_w:.0f} W{limit}")
    if not obs.busy:
        parts.append(f"at {obs.util_gpu_pct or 0:.0f}% utilisation")
    summary = "; ".join(p for p in parts if p)

    if metric == "power_limit_w" and perf.power_limit is not None:
        value, peer_median, deviation = perf.power_limit.value, perf.power_limit.peer_median, perf.power_limit.deviation
    elif perf.clock is not None:
        value, peer_median, deviation = perf.clock.value, perf.clock.peer_median, perf.clock.deviation
    else:
        value, peer_median, deviation = obs.sm_clock_mhz, None, None
    evidence: dict[str, Any] = {
        "peer_median": rnd(peer_median, 1),
        "deviation": rnd(deviation),
        "trigger": perf.trigger,
        "reasons": reason_names(obs.clocks_event_reasons),
        "reasons_bits": obs.clocks_event_reasons,
        "sm_clock_mhz": obs.sm_clock_mhz,
        "sm_clock_max_mhz": obs.sm_clock_max_mhz,
        "peer_sm_clock_mhz": rnd(perf.clock.peer_median, 1) if perf.clock else None,
        "clock_deviation": rnd(perf.clock.deviation) if perf.clock else None,
        "clock_z": rnd(perf.clock.z, 2) if perf.clock else None,
        "temp_c": obs.temp_c,
        "peer_temp_c": perf.temps[1] if perf.temps else None,
        "power_w": obs.power_w,
        "power_limit_w": obs.power_limit_w,
        "peer_power_limit_w": perf.power_limit.peer_median if perf.power_limit else None,
        "util_gpu_pct": obs.util_gpu_pct,
    }
    return Finding(cause=perf.cause, severity=severity, summary=summary, evidence={"metric": metric, "value": value, **drop_none(evidence)},
                   open_after_s=perf.open_after_s)


def _clock_text(perf: Perf) -> str:
    obs = perf.obs
    label = gpu_label(obs)
    if obs.sm_clock_mhz is None:
        return label
    if perf.clock is not None:
        return f"{label} SM clock {perf.clock.value:.0f} MHz vs peer median {perf.clock.peer_median:.0f} MHz ({pct(perf.clock.deviation)})"
    if obs.sm_clock_max_mhz:
        return f"{label} SM clock {obs.sm_clock_mhz:.0f} of max {obs.sm_clock_max_mhz:.0f} MHz"
    return f"{label} SM clock {obs.sm_clock_mhz:.0f} MHz"
