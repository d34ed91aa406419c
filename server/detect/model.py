"""What rules see: observations of one GPU or NIC at one sample instant, their windows, the
statistics of their peers at that instant, and what a rule reports."""

from __future__ import annotations

import itertools
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Literal

import msgspec

from agent.fields import GPU_READINGS, NIC_READINGS, Reading
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


def _busy(self) -> bool:
    """Doing work (server/peer_groups.py is_busy, inlined: this runs for every GPU at every
    instant, and the call cost the detector 3%). Idle GPUs are never judged as slow."""
    if self.clocks_event_reasons is not None and self.clocks_event_reasons & IDLE_REASON:
        return False
    return self.util_gpu_pct is not None and self.util_gpu_pct >= BUSY_UTIL_PCT


def _sm_clock_ratio(self) -> float | None:
    if self.sm_clock_mhz is None or not self.sm_clock_max_mhz:
        return None
    return self.sm_clock_mhz / self.sm_clock_max_mhz


# Reasons that hold a busy GPU's clock down by design; without any of them it runs at its
# boost clock, whatever phase of its job's step it is in.
HOLDS_CLOCK = SW_POWER_CAP | HW_SLOWDOWN | SW_THERMAL | HW_THERMAL | HW_POWER_BRAKE


# A GPU that draws this share of its enforced limit is on its power cap, as the SW power cap
# bit would say, whether or not the bit is reported (a driver or vGPU answering NOT_SUPPORTED)
# or set in this sample (the bits read a moment apart from the clock and the draw): what the
# power controller does at the limit (busy GPUs with the bit draw 97-99% of it in the real RTX
# 4090 dumps). A GPU slowed by anything else draws less.
CAP_DRAW = 0.97


def _reasons(self) -> int:
    """The clock-event reason bits (0 where not reported), with the SW power cap bit where the
    power draw says the GPU is on its cap."""
    bits = self.clocks_event_reasons or 0
    limit, power = self.power_limit_w, self.power_w
    return bits | SW_POWER_CAP if limit and power is not None and power >= CAP_DRAW * limit else bits


def _free_clock(self) -> float | None:
    """The SM clock ratio of a busy GPU that nothing holds down (no power, thermal or slowdown
    reason); None otherwise. Unlike the clock itself this does not depend on when in a step it
    was read, so GPUs of different nodes compare (server/detect/across_window.py)."""
    if not self.busy or self.clocks_event_reasons is None or _reasons(self) & HOLDS_CLOCK:
        return None  # held down, or no telling (a GPU whose driver does not report the reasons)
    return self.sm_clock_ratio


def copied_readings(readings: tuple[Reading, ...]) -> tuple[Reading, ...]:
    """The readings an observation carries as stored (agent/fields.py `detect`)."""
    return tuple(r for r in readings if r.detect)


def derived_names(readings: tuple[Reading, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The per-second rates and the increases an observation carries, by name, in table order."""
    rates = tuple(dict.fromkeys(r.rate for r in readings if r.rate))
    deltas = tuple(r.delta for r in readings if r.delta)
    return rates, deltas


def _observation(name: str, identity: list[tuple], readings: tuple[Reading, ...], middle: list[tuple], tail: list[tuple] = (),
                 namespace: dict | None = None) -> type:
    """An observation type: identity, the readings it copies (agent/fields.py), `middle`, the
    rates and increases derived from counters (None for the first sample, after a counter reset,
    or when unreadable), then `tail`. Built positionally by server/detect/observe.py."""
    copied = [(r.name, r.type if not r.nullable else r.type | None, r.default) for r in copied_readings(readings)]
    rates, deltas = derived_names(readings)
    derived = [(n, float | None, None) for n in rates] + [(n, int | None, None) for n in deltas]
    # gc=False: observations hold no containers, so they can never be part of a cycle, and the
    # cyclic GC need not walk the hundreds of thousands held in windows (each of its full
    # collections stood every request of the process still: issue #12).
    return msgspec.defstruct(name, [*identity, *copied, *middle, *derived, *tail], gc=False, namespace=namespace, module=__name__)


# One GPU at one sample instant. Rates are per second over the previous sample of the same GPU.
GpuObs = _observation(
    "GpuObs",
    [("ts", float), ("cluster", str), ("node", str), ("uuid", str), ("index", int), ("model", str | None),
     ("group", str)],  # group: the peer group key, cluster|model|job-or-partition-or-*
    GPU_READINGS,
    [("xids", tuple[int, ...], ()),
     ("workload", str | None, None),  # what runs on it, as a person names it ("job llm-a, pod llm-a-3"), if attributed
     ("job", str | None, None)],  # that workload's job name ("llm-a"), for filtering
    namespace={"busy": property(_busy), "sm_clock_ratio": property(_sm_clock_ratio), "free_clock": property(_free_clock),
               "reasons": property(_reasons)},
)
# One IB/RoCE port at one sample instant; rates per second over the previous sample.
NicObs = _observation(
    "NicObs",
    [("ts", float), ("cluster", str), ("node", str), ("device", str), ("port", int), ("group", str)],
    NIC_READINGS,
    [],
    [("node_busy", bool, False),  # the node's GPUs are working: a quiet port is then suspicious
     # The link rate of the same port (device, port number) on the other nodes of its group: what
     # this port should run at. None when no other node has it.
     ("expected_rate_gbps", float | None, None)],
)


class Robust:
    """Median and MAD of one metric across a peer group at one instant. Given the values
    (`Robust.of`), each is worked out when first asked: every node instant gets the statistics
    of every metric, and most are never read (no rule looks further at a GPU the screen lets go)."""

    __slots__ = ("_values", "_median", "_mad", "n")

    def __init__(self, median: float, mad: float, n: int):
        self._values: list | None = None
        self._median, self._mad, self.n = median, mad, n

    @classmethod
    def of(cls, values: list) -> Robust | None:
        """Of these values (not None; taken over, and sorted in place), None if there are none."""
        if not values:
            return None
        self = cls.__new__(cls)
        self._values, self._median, self._mad, self.n = values, None, None, len(values)
        return self

    @property
    def median(self) -> float:
        if self._median is None:
            self._values.sort()
            self._median = _median_of_sorted(self._values)
        return self._median

    @property
    def mad(self) -> float:
        if self._mad is None:
            m = self.median
            self._mad = _median_of_sorted(sorted([abs(v - m) for v in self._values]))
        return self._mad

    def near(self, value: float, tolerance: float) -> int:
        """How many of the values lie within `tolerance` of `value` (a member's own included)."""
        self.median  # sorts the values
        return bisect_right(self._values, value + tolerance) - bisect_left(self._values, value - tolerance)

    def z(self, value: float, floor: float) -> float:
        """Robust z-score; `floor` keeps a too-tight group (MAD ≈ 0) from making noise huge."""
        scale = max(1.4826 * self.mad, floor)
        return (value - self.median) / scale

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Robust):
            return NotImplemented
        return (self.median, self.mad, self.n) == (other.median, other.mad, other.n)

    def __repr__(self) -> str:
        return f"Robust(median={self.median!r}, mad={self.mad!r}, n={self.n!r})"


def _median_of_sorted(ordered: list) -> float:
    """statistics.median's arithmetic (so the same floats) without its call overhead."""
    n = len(ordered)
    i = n // 2
    return ordered[i] if n % 2 else (ordered[i - 1] + ordered[i]) / 2


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
    power_capped: float = 0.0  # share of the busy members with the SW power cap bit


@dataclass(slots=True)
class NicPeerStats:
    group: str
    size: int
    rate_gbps: Robust | None = None
    bps: Robust | None = None
    xmit_wait_per_s: Robust | None = None


class GpuErrors(msgspec.Struct, gc=False):
    """The error rates of a GPU's past record, where one of them moved."""

    pcie_replay_per_s: float | None
    nvlink_crc_per_s: float | None
    nvlink_replay_per_s: float | None
    nvlink_recovery_per_s: float | None


class NicErrors(msgspec.Struct, gc=False):
    """The errors of a port's past record, where one of them moved."""

    symbol_errors_per_s: float | None
    rcv_errors_per_s: float | None
    link_downed_new: int | None


def _moved(errors_type: type, name: str) -> property:
    """A past record's error rate: 0.0 when none moved (or unknown: the rules count both as
    none), so that most records carry no errors object at all."""
    def get(self) -> float | int:
        errors = self.errors
        return 0.0 if errors is None else getattr(errors, name) or 0.0
    return property(get, doc=f"{errors_type.__name__}.{name}")


class GpuPast(msgspec.Struct, gc=False):
    """What a GPU's observation keeps once it is no longer among the newest: what the default
    rules read of older observations (the error rates they sum over rate_window_s:
    rules/_common.py `increase`) and what windows aligned across nodes read
    (server/detect/across_window.py). A third of the observation's memory."""

    ts: float
    group: str
    busy: bool
    nvlink_bps: float | None
    power_limit_w: float | None
    free_clock: float | None
    sm_clock_ratio: float | None  # a held-down clock too: a lower bound of what the GPU could run at
    errors: GpuErrors | None = None

    pcie_replay_per_s = _moved(GpuErrors, "pcie_replay_per_s")
    nvlink_crc_per_s = _moved(GpuErrors, "nvlink_crc_per_s")
    nvlink_replay_per_s = _moved(GpuErrors, "nvlink_replay_per_s")
    nvlink_recovery_per_s = _moved(GpuErrors, "nvlink_recovery_per_s")


class NicPast(msgspec.Struct, gc=False):
    """A port's observation once no longer among the newest (as GpuPast; rules/network.py sums
    its error rates and link downs and averages its transmit wait over rate_window_s)."""

    ts: float
    group: str
    node_busy: bool
    bps: float | None
    xmit_wait_per_s: float | None
    errors: NicErrors | None = None

    symbol_errors_per_s = _moved(NicErrors, "symbol_errors_per_s")
    rcv_errors_per_s = _moved(NicErrors, "rcv_errors_per_s")
    link_downed_new = _moved(NicErrors, "link_downed_new")


def gpu_past(obs) -> GpuPast:
    errors = None
    if obs.pcie_replay_per_s or obs.nvlink_crc_per_s or obs.nvlink_replay_per_s or obs.nvlink_recovery_per_s:
        errors = GpuErrors(obs.pcie_replay_per_s, obs.nvlink_crc_per_s, obs.nvlink_replay_per_s, obs.nvlink_recovery_per_s)
    free = obs.free_clock  # the clock ratio itself where free: computed once
    return GpuPast(obs.ts, obs.group, obs.busy, obs.nvlink_bps, obs.power_limit_w, free, free if free is not None else obs.sm_clock_ratio,
                   errors)


def nic_past(obs) -> NicPast:
    errors = None
    if obs.symbol_errors_per_s or obs.rcv_errors_per_s or obs.link_downed_new:
        errors = NicErrors(obs.symbol_errors_per_s, obs.rcv_errors_per_s, obs.link_downed_new)
    return NicPast(obs.ts, obs.group, obs.node_busy, obs.bps, obs.xmit_wait_per_s, errors)


ts_of = attrgetter("ts")  # for bisecting a window's items by sample time


_WINDOWS_MADE = itertools.count()


def _stagger() -> float:
    return next(_WINDOWS_MADE) % 8 / 8


# gc=False (as for observations): a window leads to nothing that leads back to it, so it can
# never be part of a cycle, and the cyclic GC's full collections, which stop every thread of the
# process, need not walk one window per GPU and per port (its two lists they still walk: a
# tuple instead would be untracked only after a collection had looked at it, and a new one per
# sample cost the young collections more than it saved). Lists, not deques: a deque takes a
# block of 64 slots (760 bytes) even when it holds three items, two per GPU and per port;
# what leaves a list leaves from its front a few at a time, every few instants, moving some
# twenty pointers. eq=False: a window is itself.
class Window(msgspec.Struct, gc=False, eq=False):
    """The last observations of one GPU or NIC, oldest first; `latest` is the one judged. The
    detector keeps those within its keep_s of sample time of the newest, 120 at most: the
    newest as whole observations (`recent`: the rules judge the newest whole), the older ones
    as their past record (`past`: GpuPast, NicPast). `items` is both, in order."""

    recent: list = msgspec.field(default_factory=list)
    past: list = msgspec.field(default_factory=list)
    _typical: Any = None  # rules/_common.py: the typical interval, per content
    stagger: float = msgspec.field(default_factory=_stagger)  # when, within the engine's slack, this window ages

    @property
    def items(self) -> list:
        """Both, oldest first, as one list (made in C; read, not kept: a new list each time)."""
        return self.past + self.recent if self.past else self.recent[:]

    @property
    def latest(self):
        return self.recent[-1]

    def age(self, now: float, full_s: float, keep_s: float, most: int, past) -> None:
        """Whole observations older than full_s before `now` become their past record (`past`:
        gpu_past, nic_past); past records older than keep_s go, and the oldest beyond `most`
        in all (past records first: the rest stay one run of samples, without a hole)."""
        recent, older = self.recent, self.past
        moved = min(bisect_left(recent, now - full_s, key=ts_of), len(recent) - 1)  # the newest stays whole
        if moved:
            older += map(past, recent[:moved])
            del recent[:moved]
        gone = bisect_left(older, now - keep_s, key=ts_of)
        excess = len(older) + len(recent) - most - gone
        if excess > 0:  # the oldest beyond `most`: past records first, then whole ones
            gone = min(len(older), gone + excess)
            excess = len(older) + len(recent) - most - gone
        if gone:
            del older[:gone]
        if excess > 0:
            del recent[:excess]

    def since(self, seconds: float) -> list:
        """Observations within `seconds` before the latest (inclusive)."""
        if not self.recent:
            return []
        start = self.recent[-1].ts - seconds
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
    # Sample time its run of hits must span before an episode opens, where the rule asks for
    # longer than the detector's open_after_s (persistence.py).
    open_after_s: float | None = None
    # Hits in a row it needs before an episode opens: a throughput figure alone asks for 2 (a
    # slow link is slow at every sample; a counter its driver refreshed late reads low, then
    # high, and the run of hits tolerates a miss between two: persistence.py).
    in_row: int = 1
