"""Injectable GPU faults: what each does to the simulated readings, and a spec parser.

A fault is applied on top of the healthy baseline every time the GPU's state is recomputed
(so noise stays realistic), may have a one-shot effect when injected (an XID, an ECC hit),
and may undo something when cleared. Reason bits are NVML's clocks-event bits.

  thermal[=1|2]        hot; 1: SW thermal (0x20), 2 (default): also HW thermal 0x40 + HW slowdown 0x8
  power_brake          external power brake: 0x8|0x80, SM clock collapses to ~100 MHz
  low_power_cap[=W]    enforced limit below peers (default 60 % of TDP): SW power cap, lower clocks
  hw_slowdown          0x8, clocks halved
  clocks_stuck_low[=MHz]  SM clock well below peers (default 55 % of max), no reason bit
  nvlink_down[=k]      the last k links (default 1) inactive; one recovery error per link
  nvlink_errors[=r]    CRC/replay/recovery errors rising at ~r per second (default 20)
  pcie_downtrained[=w] link at gen max-2 and width w (default half) even when busy
  pcie_replays[=r]     PCIe replay counter rising at r per second (default 2)
  xid[=N]              emit XID N (default 79) once through the event set, at the next advance
  ecc[=n]              n uncorrected errors (default 1) + a pending row remap; corrected errors trickle
  remap_failure        an uncorrected error whose row remap failed: no spare row left in its bank
                       (nvmlDeviceGetRemappedRows' failureOccurred); clearing it = the board replaced
  lost                 fallen off the bus: every call answers NVML_ERROR_GPU_IS_LOST; clearing it
                       brings the GPU back with a new device handle (as after a reset)
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import pynvml

from agent.sim.models import GpuModel, power_and_clock
from agent.sim.state import Counters, GpuState

IDLE = pynvml.nvmlClocksEventReasonGpuIdle
SW_POWER_CAP = pynvml.nvmlClocksEventReasonSwPowerCap
HW_SLOWDOWN = pynvml.nvmlClocksEventReasonHwSlowdown
SW_THERMAL = pynvml.nvmlClocksEventReasonSwThermalSlowdown
HW_THERMAL = pynvml.nvmlClocksEventReasonHwThermalSlowdown
HW_POWER_BRAKE = pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown


class FaultyGpu(Protocol):
    """What a fault may touch on a simulated GPU (agent/sim/gpu.py's SimGpu, which applies them)."""

    model: GpuModel
    rng: random.Random
    counters: Counters
    remap_pending: bool
    remap_failure: bool

    def demand_w(self) -> float: ...

    def queue_xid(self, xid: int) -> None: ...

    def new_handle(self) -> None: ...


@dataclass(slots=True)
class Fault:
    name: str
    arg: float | None = None


@dataclass(frozen=True, slots=True)
class FaultKind:
    name: str
    apply: Callable[[FaultyGpu, GpuState, Any], None] | None = None  # every recompute
    start: Callable[[FaultyGpu, Any], None] | None = None  # once, when injected
    stop: Callable[[FaultyGpu], None] | None = None  # once, when cleared
    one_shot: bool = False  # nothing lasting: dropped right after start


def _slow(gpu: FaultyGpu, s: GpuState, scale: float) -> None:
    """Clocks down by `scale`; power follows the dynamic part down; no longer power capped."""
    s.sm_clock_mhz = max(60.0, s.sm_clock_mhz * scale)
    idle = gpu.model.power_idle_w
    s.power_w = min(s.power_w, idle + max(0.0, s.power_w - idle) * scale**1.5)
    s.reasons &= ~SW_POWER_CAP


def _thermal(gpu: FaultyGpu, s: GpuState, arg: Any) -> None:
    level = int(arg or 2)
    s.temp_c = max(s.temp_c, (86.0 if level == 1 else 91.0) + gpu.rng.gauss(0, 0.8))
    if s.mem_temp_c is not None:
        s.mem_temp_c = max(s.mem_temp_c, s.temp_c + 3.0)
    s.reasons |= SW_THERMAL
    scale = 0.75
    if level >= 2:
        s.reasons |= HW_THERMAL | HW_SLOWDOWN
        scale = 0.5  # HW slowdown cuts the clock by a factor of 2 or more (nvml.h)
    _slow(gpu, s, scale)


def _power_brake(gpu: FaultyGpu, s: GpuState, arg: Any) -> None:
    # Real 8x H100 node under a power brake: 86 MHz of 1980, ~70 W, no Idle bit.
    s.reasons = (s.reasons | HW_SLOWDOWN | HW_POWER_BRAKE) & ~(IDLE | SW_POWER_CAP)
    s.sm_clock_mhz = gpu.model.sm_clock_max_mhz * gpu.rng.uniform(0.04, 0.07)
    s.power_w = gpu.model.power_idle_w * (1.6 if s.busy else 1.0) * gpu.rng.uniform(0.97, 1.03)


def _low_power_cap(gpu: FaultyGpu, s: GpuState, arg: Any) -> None:
    cap = float(arg) if arg else round(gpu.model.power_limit_w * 0.6)
    s.power_limit_w = cap
    if s.busy:
        s.power_w, s.sm_clock_mhz, capped = power_and_clock(gpu.model, gpu.demand_w(), cap, gpu.rng)
        if capped:
            s.reasons |= SW_POWER_CAP


def _hw_slowdown(gpu: FaultyGpu, s: GpuState, arg: Any) -> None:
    s.reasons |= HW_SLOWDOWN
    _slow(gpu, s, 0.5)


def _clocks_stuck_low(gpu: FaultyGpu, s: GpuState, arg: Any) -> None:
    target = float(arg) if arg else gpu.model.sm_clock_max_mhz * 0.55
    if s.sm_clock_mhz > target:
        _slow(gpu, s, target / s.sm_clock_mhz)  # no reason bit: the silent straggler


def _nvlink_down(gpu: FaultyGpu, s: GpuState, arg: Any) -> None:
    k = min(int(arg or 1), len(s.links_up))
    for link in range(len(s.links_up) - k, len(s.links_up)):
        s.links_up[link] = False


def _nvlink_down_start(gpu: FaultyGpu, arg: Any) -> None:
    gpu.counters.nvlink_recovery += min(int(arg or 1), gpu.model.nvlink_links)


def _nvlink_errors(gpu: FaultyGpu, s: GpuState, arg: Any) -> None:
    if not s.links_up:
        return
    rate = float(arg or 20.0)
    s.nvlink_crc_flit_rate += rate * 0.7
    s.nvlink_crc_data_rate += rate * 0.3
    s.nvlink_replay_rate += rate * 0.25
    s.nvlink_recovery_rate += rate * 0.005
    s.nvlink_link_bps *= 0.9  # replays eat bandwidth


def _pcie_downtrained(gpu: FaultyGpu, s: GpuState, arg: Any) -> None:
    m = gpu.model
    s.pcie_gen = min(s.pcie_gen, max(1, m.pcie_gen_max - 2))
    s.pcie_width = min(s.pcie_width, int(arg) if arg else max(1, m.pcie_width_max // 2))
    s.pcie_tx_bps *= 0.8
    s.pcie_rx_bps *= 0.8


def _pcie_replays(gpu: FaultyGpu, s: GpuState, arg: Any) -> None:
    s.pcie_replay_rate += float(arg or 2.0)


def _xid_start(gpu: FaultyGpu, arg: Any) -> None:
    gpu.queue_xid(int(arg or 79))


def _ecc(gpu: FaultyGpu, s: GpuState, arg: Any) -> None:
    if gpu.model.ecc:
        s.ecc_corrected_rate += 0.05  # a failing row usually also throws correctable errors


def _ecc_start(gpu: FaultyGpu, arg: Any) -> None:
    if gpu.model.ecc:
        gpu.counters.ecc_uncorrected += int(arg or 1)
    if gpu.model.row_remapping:
        gpu.counters.remap_uncorrectable += 1
        gpu.remap_pending = True


def _remap_failure_start(gpu: FaultyGpu, arg: Any) -> None:
    if gpu.model.ecc:
        gpu.counters.ecc_uncorrected += 1
    if gpu.model.row_remapping:
        gpu.remap_failure = True


def _remap_failure_stop(gpu: FaultyGpu) -> None:
    gpu.remap_failure = False


def _lost_stop(gpu: FaultyGpu) -> None:
    # Back on the bus means reset and re-enumerated: handles from before do not work anymore.
    gpu.new_handle()


def _ecc_stop(gpu: FaultyGpu) -> None:
    gpu.remap_pending = False  # as after the GPU reset that performs the remap


FAULT_KINDS: dict[str, FaultKind] = {
    k.name: k
    for k in (
        FaultKind("thermal", apply=_thermal),
        FaultKind("power_brake", apply=_power_brake),
        FaultKind("low_power_cap", apply=_low_power_cap),
        FaultKind("hw_slowdown", apply=_hw_slowdown),
        FaultKind("clocks_stuck_low", apply=_clocks_stuck_low),
        FaultKind("nvlink_down", apply=_nvlink_down, start=_nvlink_down_start),
        FaultKind("nvlink_errors", apply=_nvlink_errors),
        FaultKind("pcie_downtrained", apply=_pcie_downtrained),
        FaultKind("pcie_replays", apply=_pcie_replays),
        FaultKind("xid", start=_xid_start, one_shot=True),
        FaultKind("ecc", apply=_ecc, start=_ecc_start, stop=_ecc_stop),
        FaultKind("remap_failure", start=_remap_failure_start, stop=_remap_failure_stop),
        FaultKind("lost", stop=_lost_stop),  # SimGpu.lost; the fake library answers GPU_IS_LOST
    )
}


@dataclass(frozen=True, slots=True)
class FaultSpec:
    gpu: int | None  # None: every GPU of the node
    name: str
    arg: float | None = None
    node: str | None = None  # None: whichever node the caller applies it to


_SPEC = re.compile(r"^(?:(?P<node>[^/:]+)/)?(?:gpu)?(?P<gpu>\d+|\*|all):(?P<name>[a-z_]+)(?:=(?P<arg>[-+.\deE]+))?$")


def parse_fault_spec(text: str) -> FaultSpec:
    """'gpu3:thermal', '3:xid=79', '*:power_brake', 'node-02/gpu1:nvlink_down=2'."""
    m = _SPEC.match(text.strip())
    if not m:
        raise ValueError(f"bad fault spec {text!r}; expected [node/]gpuN:fault[=arg]")
    name = m["name"]
    if name not in FAULT_KINDS:
        raise ValueError(f"unknown fault {name!r}; known: {', '.join(FAULT_KINDS)}")
    gpu = None if m["gpu"] in ("*", "all") else int(m["gpu"])
    arg: float | None = None
    if m["arg"] is not None:
        value = float(m["arg"])
        arg = int(value) if value.is_integer() else value
    return FaultSpec(gpu=gpu, name=name, arg=arg, node=m["node"])
