"""What rules see: observations of one GPU or NIC at one sample instant, their windows, the
statistics of their peers at that instant, and what a rule reports."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from server.peer_groups import BUSY_UTIL_PCT, IDLE_REASON

Severity = Literal["warning", "critical"]

# NVML clock-event reason bits (nvmlClocksEventReason*).
IDLE = 0x1
APP_CLOCKS = 0x2
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SYNC_BOOST = 0x10
SW_THERMAL = 0x20
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80
DISPLAY_CLOCKS = 0x100

REASON_NAMES = {
    IDLE: "GPU idle",
    APP_CLOCKS: "applications clocks setting",
    SW_POWER_CAP: "SW power cap",
    HW_SLOWDOWN: "HW slowdown",
    SYNC_BOOST: "sync boost",
    SW_THERMAL: "SW thermal slowdown",
    HW_THERMAL: "HW thermal slowdown",
    HW_POWER_BRAKE: "HW power brake",
    DISPLAY_CLOCKS: "display clock setting",
}


def reason_names(bits: int | None) -> list[str]:
    if not bits:
        return []
    return [name for bit, name in REASON_NAMES.items() if bits & bit]


# Observations are msgspec Structs with gc=False: they hold no containers, so they can never be
# part of a cycle, and the cyclic GC need not walk the hundreds of thousands held in windows
# (each of its full collections stood every request of the process still: issue #12).
class GpuObs(msgspec.Struct, gc=False):
    """One GPU at one sample instant. Rates are per second over the previous sample of the
    same GPU (None for the first sample, after a counter reset, or when unreadable)."""

    ts: float
    cluster: str
    node: str
    uuid: str
    index: int
    model: str | None
    group: str  # peer group key: cluster|model|job-or-partition-or-*
    lost: bool = False
    util_gpu_pct: float | None = None
    sm_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    temp_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    reasons: int | None = None
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    nvlink_links_up: int | None = None
    nvlink_links_total: int | None = None
    ecc_uncorrected_total: int | None = None
    remapped_rows_pending: bool | None = None
    xids: tuple[int, ...] = ()
    workload: str | None = None  # what runs on it, as a person names it ("job llm-a, pod llm-a-3"), if attributed
    job: str | None = None  # that workload's job name ("llm-a"), for filtering
    # Derived from counter deltas (per second), None when not computable.
    nvlink_bps: float | None = None  # tx + rx bytes/s
    nvlink_crc_per_s: float | None = None
    nvlink_replay_per_s: float | None = None
    nvlink_recovery_per_s: float | None = None
    pcie_replay_per_s: float | None = None
    ecc_uncorrected_new: int | None = None  # increase since the previous sample

    @property
    def busy(self) -> bool:
        """Doing work (server/peer_groups.py is_busy, inlined: this runs for every GPU at every
        instant, and the call cost the detector 3%). Idle GPUs are never judged as slow."""
        if self.reasons is not None and self.reasons & IDLE_REASON:
            return False
        return self.util_gpu_pct is not None and self.util_gpu_pct >= BUSY_UTIL_PCT

    @property
    def sm_clock_ratio(self) -> float | None:
        if self.sm_clock_mhz is None or not self.sm_clock_max_mhz:
            return None
        return self.sm_clock_mhz / self.sm_clock_max_mhz


class NicObs(msgspec.Struct, gc=False):
    """One IB/RoCE port at one sample instant; rates per second over the previous sample."""

    ts: float
    cluster: str
    node: str
    device: str
    port: int
    group: str
    state: str | None = None
    rate_gbps: float | None = None
    bps: float | None = None  # tx + rx bytes/s
    symbol_errors_per_s: float | None = None
    rcv_errors_per_s: float | None = None
    link_downed_new: int | None = None
    xmit_wait_per_s: float | None = None
    node_busy: bool = False  # the node's GPUs are working: a quiet port is then suspicious
    # The link rate of the same port (device, port number) on the other nodes of its group: what
    # this port should run at. None when no other node has it.
    expected_rate_gbps: float | None = None


@dataclass(slots=True)
class Robust:
    """Median and MAD of one metric across a peer group at one instant."""

    median: float
    mad: float
    n: int

    def z(self, value: float, floor: float) -> float:
        """Robust z-score; `floor` keeps a too-tight group (MAD ≈ 0) from making noise huge."""
        scale = max(1.4826 * self.mad, floor)
        return (value - self.median) / scale


@dataclass(slots=True)
class PeerStats:
    """Statistics of a peer group's busy members at one instant (None: too few peers)."""

    group: str
    size: int
    sm_clock_ratio: Robust | None = None
    sm_clock_max_mhz: Robust | None = None
    temp_c: Robust | None = None
    power_w: Robust | None = None
    power_limit_w: Robust | None = None
    nvlink_bps: Robust | None = None


@dataclass(slots=True)
class NicPeerStats:
    group: str
    size: int
    rate_gbps: Robust | None = None
    bps: Robust | None = None
    xmit_wait_per_s: Robust | None = None


@dataclass
class Window:
    """The last observations of one GPU or NIC, oldest first; `latest` is the one judged."""

    items: deque = field(default_factory=lambda: deque(maxlen=120))

    @property
    def latest(self):
        return self.items[-1]

    def since(self, seconds: float) -> list:
        """Observations within `seconds` before the latest (inclusive)."""
        if not self.items:
            return []
        start = self.items[-1].ts - seconds
        return [o for o in self.items if o.ts >= start]


@dataclass(slots=True)
class Finding:
    """A rule's verdict on the latest instant: the cause, how bad, and the numbers behind it."""

    cause: str
    severity: Severity
    summary: str
    evidence: dict[str, Any]
    # Rules for one-off hardware events (an XID, a newly uncorrected ECC error) need no
    # persistence: one sample is the event.
    immediate: bool = False
    # When the condition began, if the rule knows better than "its first flagged instant".
    onset: float | None = None
