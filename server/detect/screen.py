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

from server.detect.model import HW_POWER_BRAKE, HW_SLOWDOWN, HW_THERMAL, SW_THERMAL, GpuObs, NicObs, NicPeerStats, PeerStats
from server.detect.rules.network import ACTIVE_STATES, RATE_TOLERANCE
from server.detect.settings import DetectionSettings

NEVER = float("-inf")
# The screen's thresholds are the rules' loosened by a hair: the same arithmetic, but a value a
# rule would flag must never be let through by a rounding difference.
_LOOSE = 1e-9
_HARDWARE_BITS = HW_THERMAL | HW_POWER_BRAKE | HW_SLOWDOWN | SW_THERMAL


@dataclass(slots=True)
class Recent:
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


def gpu_may_find(obs: GpuObs, peers: PeerStats | None, recent: Recent, cfg: DetectionSettings) -> bool:
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
    if busy and peers is not None and _below_peers(obs, peers, cfg):
        return True
    return _pcie_off(obs, busy)


def _below_peers(obs: GpuObs, peers: PeerStats, cfg: DetectionSettings) -> bool:
    """The peer comparisons of _perf.triage (5-8) and the nvlink rule, by their deviation alone
    (each rule also asks a z-score of it): power limit, SM clock or NVLink throughput below the
    peers'. Written out, not through the rules' helpers: this runs for every busy GPU at every
    instant, and the objects those build cost more than the rest of the screen."""
    limit = peers.power_limit_w
    if obs.power_limit_w is not None and limit is not None and limit.median > 0:
        if obs.power_limit_w / limit.median - 1.0 <= _LOOSE - cfg.power_limit_drop:
            return True
    ratio = peers.sm_clock_ratio
    if ratio is not None and obs.sm_clock_mhz is not None and ratio.median > 0:
        peer_max = peers.sm_clock_max_mhz.median if peers.sm_clock_max_mhz is not None else obs.sm_clock_max_mhz
        if peer_max and (obs.sm_clock_mhz / peer_max) / ratio.median - 1.0 <= _LOOSE - cfg.clock_drop:
            return True
    bw, stats = obs.nvlink_bps, peers.nvlink_bps
    return bw is not None and stats is not None and stats.median >= cfg.nvlink_min_bps and \
        bw / stats.median - 1.0 <= _LOOSE - cfg.nvlink_bw_drop


def _pcie_off(obs: GpuObs, busy: bool) -> bool:
    if obs.pcie_width is not None and obs.pcie_width_max is not None and obs.pcie_width < obs.pcie_width_max:
        return True
    return busy and obs.pcie_gen is not None and obs.pcie_gen_max is not None and obs.pcie_gen < obs.pcie_gen_max


def nic_may_find(obs: NicObs, peers: NicPeerStats | None, recent: Recent, cfg: DetectionSettings) -> bool:
    if obs.state is not None and obs.state.upper() not in ACTIVE_STATES:
        return True
    expected = obs.expected_rate_gbps
    if expected is None and peers is not None and peers.rate_gbps is not None:
        expected = peers.rate_gbps.median
    if obs.rate_gbps is not None and expected is not None and obs.rate_gbps < expected * (1 - RATE_TOLERANCE):
        return True
    start = obs.ts - cfg.rate_window_s
    # Errors and flaps are summed over observations after `start`; the wait is averaged over
    # those at or after it, and only counts above ib_wait_factor × ib_wait_floor_per_s.
    if recent.errors > start or recent.flaps > start or recent.wait >= start:
        return True
    # Throughput below the peers' (the network rule's test by its deviation alone, as above).
    stats = peers.bps if peers is not None and obs.node_busy else None
    return obs.bps is not None and stats is not None and stats.median >= cfg.ib_min_bps and \
        obs.bps / stats.median - 1.0 <= _LOOSE - cfg.ib_bw_drop
