"""The screen: a cheap test, per GPU or port and instant, of whether any rule of
rules.GPU_RULES / rules.NIC_RULES *could* find something. Almost every GPU of a fleet is fine
almost all the time, and running the nine rules on each one at each instant was most of the
detector's CPU (a 10,000-GPU window: 0.68 s, 70 % of it in the rules).

The screen must never say "nothing" where a rule would find something: it is the rules'
triggers, taken one by one, loosened where a rule looks at a window of sample time. A rule
that counts a counter's increase over rate_window_s can only fire when some observation
inside that span had a positive rate, so each GPU and port remembers the last instant it saw
one (`Recent`). tests/detect/test_screen.py checks, on fleets with faults of every cause,
that the engine finds exactly the same episodes with and without it.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from server.detect.model import HW_POWER_BRAKE, HW_SLOWDOWN, HW_THERMAL, SW_THERMAL, GpuObs, NicObs, NicPeerStats, PeerStats
from server.detect.rules.network import ACTIVE_STATES, RATE_TOLERANCE
from server.detect.settings import DetectionSettings

NEVER = float("-inf")
# The screen's bounds are the rules' thresholds loosened by a hair: a value a rule would flag
# must never be let through by a rounding difference.
_LOOSE = 1e-9
_HARDWARE_BITS = HW_THERMAL | HW_POWER_BRAKE | HW_SLOWDOWN | SW_THERMAL


class Recent(msgspec.Struct, gc=False, eq=False):
    """The last instant an entity showed something a windowed rule sums or averages."""

    errors: float = NEVER  # a positive error-counter rate (NVLink, PCIe replays, IB symbol/receive)
    flaps: float = NEVER  # link_downed rose
    wait: float = NEVER  # transmit-wait above the lowest level that can count as congestion

    def note_gpu(self, obs: GpuObs) -> None:
        if obs.nvlink_crc_per_s or obs.nvlink_replay_per_s or obs.nvlink_recovery_per_s or obs.pcie_replay_per_s:
            self.errors = obs.ts

    def note_nic(self, obs: NicObs, cfg: DetectionSettings) -> None:
        if obs.symbol_errors_per_s or obs.rcv_errors_per_s:
            self.errors = obs.ts
        if obs.link_downed_new:
            self.flaps = obs.ts
        if obs.xmit_wait_per_s is not None and obs.xmit_wait_per_s > cfg.ib_wait_factor * cfg.ib_wait_floor_per_s:
            self.wait = obs.ts


@dataclass(slots=True)
class Bounds:
    """Per peer group at one instant, the readings at or below which a busy member's peer
    comparisons could flag it: the rules' tests by their deviation alone (each rule also asks
    a z-score), turned around into a bound once per group so that each member costs a few
    comparisons (the screen runs for every GPU and port at every instant). -inf: no test."""

    power_limit_w: float = NEVER  # _perf.triage 5: enforced power limit below the peers'
    sm_clock_mhz: float = NEVER  # _perf.triage 6-8: SM clock below the peers'
    throughput_bps: float = NEVER  # nvlink (NVLink) or network (port) throughput below the peers'
    peer_ratio: float | None = None  # the clock bound over a GPU's own max clock, when the peers have none


def gpu_bounds(peers: PeerStats | None, cfg: DetectionSettings) -> Bounds | None:
    if peers is None:
        return None
    out = Bounds()
    limit = peers.power_limit_w
    if limit is not None and limit.median > 0:
        out.power_limit_w = limit.median * (1.0 + _LOOSE - cfg.power_limit_drop)
    ratio = peers.sm_clock_ratio
    if ratio is not None and ratio.median > 0:
        if peers.sm_clock_max_mhz is not None:
            out.sm_clock_mhz = peers.sm_clock_max_mhz.median * ratio.median * (1.0 + _LOOSE - cfg.clock_drop)
        else:
            out.peer_ratio = ratio.median * (1.0 + _LOOSE - cfg.clock_drop)
    bw = peers.nvlink_bps
    if bw is not None and bw.median >= cfg.nvlink_min_bps:
        out.throughput_bps = bw.median * (1.0 + _LOOSE - cfg.nvlink_bw_drop)
    return out


def nic_bounds(peers: NicPeerStats | None, cfg: DetectionSettings) -> Bounds | None:
    if peers is None or peers.bps is None or peers.bps.median < cfg.ib_min_bps:
        return None
    return Bounds(throughput_bps=peers.bps.median * (1.0 + _LOOSE - cfg.ib_bw_drop))


def gpu_may_find(obs: GpuObs, bounds: Bounds | None, recent: Recent, cfg: DetectionSettings) -> bool:
    if obs.lost or obs.xids or obs.ecc_uncorrected_new or obs.remapped_rows_pending:
        return True  # lost, xid, ecc
    if (obs.clocks_event_reasons or 0) & _HARDWARE_BITS:
        return True  # thermal, power, hw_slowdown by their bits (_perf.triage 1-4)
    up, total = obs.nvlink_links_up, obs.nvlink_links_total
    if up is not None and total is not None and 0 <= up < total:
        return True
    if recent.errors > obs.ts - cfg.rate_window_s:
        return True  # nvlink errors, pcie replays: an increase needs a positive rate inside the window
    busy = obs.busy
    if busy and bounds is not None and _below(obs, bounds):
        return True
    return _pcie_off(obs, busy)


def _below(obs: GpuObs, bounds: Bounds) -> bool:
    if obs.power_limit_w is not None and obs.power_limit_w <= bounds.power_limit_w:
        return True
    clock = obs.sm_clock_mhz
    if clock is not None:
        if clock <= bounds.sm_clock_mhz:
            return True
        if bounds.peer_ratio is not None and obs.sm_clock_max_mhz and clock <= obs.sm_clock_max_mhz * bounds.peer_ratio:
            return True
    return obs.nvlink_bps is not None and obs.nvlink_bps <= bounds.throughput_bps


def _pcie_off(obs: GpuObs, busy: bool) -> bool:
    if obs.pcie_width is not None and obs.pcie_width_max is not None and obs.pcie_width < obs.pcie_width_max:
        return True
    return busy and obs.pcie_gen is not None and obs.pcie_gen_max is not None and obs.pcie_gen < obs.pcie_gen_max


def nic_may_find(obs: NicObs, peers: NicPeerStats | None, bounds: Bounds | None, recent: Recent, cfg: DetectionSettings) -> bool:
    if obs.state is not None and obs.state.upper() not in ACTIVE_STATES:
        return True
    expected = obs.expected_rate_gbps
    if expected is None and obs.rate_gbps is not None and peers is not None and peers.rate_gbps is not None:
        expected = peers.rate_gbps.median
    if obs.rate_gbps is not None and expected is not None and obs.rate_gbps < expected * (1 - RATE_TOLERANCE):
        return True
    start = obs.ts - cfg.rate_window_s
    # Errors and flaps are summed over observations after `start`; the wait is averaged over
    # those at or after it, and only counts above ib_wait_factor × ib_wait_floor_per_s.
    if recent.errors > start or recent.flaps > start or recent.wait >= start:
        return True
    return obs.node_busy and bounds is not None and obs.bps is not None and obs.bps <= bounds.throughput_bps
