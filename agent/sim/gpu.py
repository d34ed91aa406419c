"""Simulated GPUs and nodes: state that moves with the sample clock.

`SimNode.advance(ts)` is the only thing that moves time: each GPU draws fresh noisy
instantaneous readings (workload baseline, then faults on top) and grows its cumulative
counters by rate x elapsed time, so deltas between two samples match the rates. Between two
advances the readings hold still, like NVML's own sampled values. Everything draws from
per-GPU RNGs seeded from (node name, seed), so a run is reproducible.
"""

from __future__ import annotations

import itertools
import random
import threading
import uuid as uuidlib
import weakref
from collections.abc import Callable

from agent.sim.faults import FAULT_KINDS, IDLE, SW_POWER_CAP, Fault, FaultSpec, parse_fault_spec
from agent.sim.models import GB, GpuModel, get_model, power_and_clock
from agent.sim.proctree import SimProcess, k8s_process, slurm_process
from agent.sim.state import Counters, GpuState

WORKLOADS = ("idle", "busy")

# Device handles must be unique across every simulated node in the process (they are the
# nvmlDevice_t pointer values pynvml hands back); 0 stays NULL.
_handles = itertools.count(0x10000, 0x100)
_by_handle: weakref.WeakValueDictionary[int, SimGpu] = weakref.WeakValueDictionary()


def gpu_by_handle(handle: int | None) -> SimGpu | None:
    """The simulated GPU behind a device handle, whichever node it is on."""
    return _by_handle.get(handle or 0)


# Real 8x H100 node bus numbers (realdata, driver 535.161.08); more GPUs continue the pattern.
_BUS_NUMBERS = (0x19, 0x3B, 0x4C, 0x5D, 0x9B, 0xBB, 0xCB, 0xDB)


def _bus_id(index: int) -> str:
    bus = _BUS_NUMBERS[index] if index < len(_BUS_NUMBERS) else 0x08 + 0x10 * index
    return f"00000000:{bus:02X}:00.0"


XidListener = Callable[["SimGpu", int], None]


class SimGpu:
    def __init__(self, node: SimNode, index: int, model: GpuModel, rng: random.Random) -> None:
        self.node = node
        self.index = index
        self.model = model
        self.rng = rng
        self.handle = 0
        self.new_handle()
        self.uuid = f"GPU-{uuidlib.UUID(int=rng.getrandbits(128), version=4)}"
        self.pci_bus_id = _bus_id(index)
        self.workload: str | None = None  # None: the node's
        # What NVML lists as running on it (SimNode.run_slurm_job / run_pod); none by default.
        self.processes: list[SimProcess] = []
        self.faults: dict[str, Fault] = {}
        # Test hook: NVML function name -> nvmlReturn_t this GPU answers for it.
        self.call_errors: dict[str, int] = {}
        self.counters = Counters(pcie_replays=rng.randint(40, 120))  # realdata: 43-120 since reset
        self.remap_pending = False
        self.remap_failure = False  # a remap found no spare row (the remap_failure fault)
        # Video engines, in % of their sampling period: a training workload leaves them idle
        # (0 %, as every GPU in realdata shows); set these to simulate a video workload.
        self.enc_util = 0
        self.dec_util = 0
        self._xid_queue: list[int] = []
        self._xid_listeners: list[XidListener] = []
        # Per-GPU constants: silicon and cooling differ a little even between healthy peers.
        self._temp_bias = rng.uniform(-3.0, 3.0)
        self._demand = rng.uniform(0.90, 1.08)  # busy power demand / TDP
        self._mem_util = rng.uniform(35.0, 55.0)
        self._mem_used_frac = rng.uniform(0.86, 0.93)
        self._pcie_bps = rng.uniform(1.0, 2.0) * GB
        # Its own stream, seeded from the uuid, so adding tensor activity left every other
        # seeded reading as it was.
        self._tensor_rng = random.Random(f"{self.uuid}/tensor")
        self._tensor_pct = model.tensor_busy_pct * self._tensor_rng.uniform(0.85, 1.15)
        # The same for the readings added with dcgm-exporter's default series (issue #16).
        self._gpm_rng = random.Random(f"{self.uuid}/gpm")
        self._dram_pct = model.dram_busy_pct * self._gpm_rng.uniform(0.85, 1.15)
        # The driver was loaded some days before the simulation starts, at about idle power.
        days_loaded = random.Random(f"{self.uuid}/energy").uniform(1.0, 30.0)
        self.counters.energy_mj = days_loaded * 86400 * model.power_idle_w * 1000
        self.state = self._compute()

    def new_handle(self) -> None:
        """A fresh device handle; the old one stops resolving (as after a GPU reset)."""
        _by_handle.pop(self.handle, None)
        self.handle = next(_handles)
        _by_handle[self.handle] = self

    # -- what the node / faults ask -------------------------------------------------------
    @property
    def lost(self) -> bool:
        return "lost" in self.faults

    @property
    def busy(self) -> bool:
        return (self.workload or self.node.workload) == "busy"

    def demand_w(self) -> float:
        """Power a busy GPU would draw without a cap (noisy around its own demand)."""
        return self.model.power_limit_w * self._demand * (1.0 + self.rng.gauss(0.0, 0.015))

    def queue_xid(self, xid: int) -> None:
        self._xid_queue.append(xid)

    def add_xid_listener(self, listener: XidListener) -> None:
        with self.node.lock:
            self._xid_listeners.append(listener)

    def remove_xid_listener(self, listener: XidListener) -> None:
        with self.node.lock:
            if listener in self._xid_listeners:
                self._xid_listeners.remove(listener)

    # -- faults ------------------------------------------------------------------------
    def inject(self, name: str, arg: float | None = None) -> None:
        kind = FAULT_KINDS.get(name)
        if kind is None:
            raise ValueError(f"unknown fault {name!r}; known: {', '.join(FAULT_KINDS)}")
        with self.node.lock:
            if kind.start:
                kind.start(self, arg)
            if not kind.one_shot:
                self.faults[name] = Fault(name, arg)
            self._refresh()

    def clear(self, name: str | None = None) -> None:
        """Clear one fault, or all of them."""
        with self.node.lock:
            for fault in [f for f in self.faults.values() if name is None or f.name == name]:
                del self.faults[fault.name]
                stop = FAULT_KINDS[fault.name].stop
                if stop:
                    stop(self)
            self._refresh()

    # -- time --------------------------------------------------------------------------
    def advance(self, dt: float) -> None:
        """Move this GPU `dt` seconds on (the node holds the lock and tracks the clock)."""
        if not self.lost:  # a GPU off the bus is frozen: nothing moves, nothing answers
            self.state = self._compute()
            self._accumulate(self.state, dt)
        queued, self._xid_queue = self._xid_queue, []
        for xid in queued:
            for listener in list(self._xid_listeners):
                listener(self, xid)

    def _refresh(self) -> None:
        if not self.lost:
            self.state = self._compute()

    def _accumulate(self, s: GpuState, dt: float) -> None:
        c = self.counters
        c.pcie_replays += s.pcie_replay_rate * dt
        c.nvlink_tx_bytes += s.nvlink_bps * dt
        c.nvlink_rx_bytes += s.nvlink_bps * dt * self._rx_ratio(s)
        c.nvlink_crc_flit += s.nvlink_crc_flit_rate * dt
        c.nvlink_crc_data += s.nvlink_crc_data_rate * dt
        c.nvlink_replay += s.nvlink_replay_rate * dt
        c.nvlink_recovery += s.nvlink_recovery_rate * dt
        c.ecc_corrected += s.ecc_corrected_rate * dt
        c.ecc_uncorrected += s.ecc_uncorrected_rate * dt
        c.tensor_active_s += s.tensor_active_pct / 100.0 * dt
        c.gr_active_s += s.gr_engine_active_pct / 100.0 * dt
        c.dram_active_s += s.dram_active_pct / 100.0 * dt
        c.energy_mj += s.power_w * 1000.0 * dt

    @staticmethod
    def _rx_ratio(s: GpuState) -> float:
        return 1.0 if s.busy else 0.9  # collectives are symmetric; idle chatter is not

    def _compute(self) -> GpuState:
        s = self._baseline()
        healthy_clock = s.sm_clock_mhz
        for fault in list(self.faults.values()):
            apply = FAULT_KINDS[fault.name].apply
            if apply:
                apply(self, s, fault.arg)
        s.tensor_active_pct = self._tensor_activity(s, healthy_clock)
        s.gr_engine_active_pct, s.dram_active_pct = self._engine_activity(s, healthy_clock)
        s.sm_clock_mhz = max(15, round(s.sm_clock_mhz / 15) * 15)  # NVML clocks step in 15 MHz
        return s

    def _tensor_activity(self, s: GpuState, healthy_clock: float) -> float:
        """Busy: this GPU's own level, noisy; idle: none. A GPU slowed below its healthy
        clock (thermal, power brake, stuck clocks) is modelled as keeping its tensor pipes fed
        for a proportionally smaller share of the time."""
        if not s.busy or self._tensor_pct <= 0:
            return 0.0
        pct = self._tensor_rng.gauss(self._tensor_pct, 2.0) * min(1.0, s.sm_clock_mhz / healthy_clock)
        return max(0.0, min(100.0, pct))

    def _engine_activity(self, s: GpuState, healthy_clock: float) -> tuple[float, float]:
        """(graphics engine %, DRAM bandwidth %) for GPM. Busy: kernels queued nearly all the
        time; DRAM at this GPU's own level, which a slowed GPU, issuing fewer requests per
        second, scales down with its clock. Idle: neither."""
        if not s.busy:
            return 0.0, 0.0
        r = self._gpm_rng
        gr = max(0.0, min(100.0, r.gauss(97.0, 1.0)))
        dram = r.gauss(self._dram_pct, 2.0) * min(1.0, s.sm_clock_mhz / healthy_clock)
        return gr, max(0.0, min(100.0, dram))

    def _baseline(self) -> GpuState:
        m, r = self.model, self.rng
        links = [True] * m.nvlink_links
        if self.busy:
            power, clock, capped = power_and_clock(m, self.demand_w(), m.power_limit_w, r)
            temp = m.temp_busy_c + self._temp_bias + 8.0 * (power / m.power_limit_w - 0.9) + r.gauss(0, 0.8)
            return GpuState(
                busy=True,
                temp_c=temp,
                mem_temp_c=None if m.mem_temp_offset_c is None else temp + m.mem_temp_offset_c + r.gauss(0, 0.5),
                power_w=power,
                power_limit_w=m.power_limit_w,
                sm_clock_mhz=clock,
                mem_clock_mhz=m.mem_clock_busy_mhz,
                util_gpu=max(90, min(100, round(r.gauss(98.5, 1.2)))),
                util_mem=max(5, min(100, round(r.gauss(self._mem_util, 3.0)))),
                mem_used_bytes=int(m.memory_total_bytes * self._mem_used_frac),
                reasons=SW_POWER_CAP if capped else 0,
                pcie_gen=m.pcie_gen_max,
                pcie_width=m.pcie_width_max,
                pcie_tx_bps=self._pcie_bps * r.uniform(0.9, 1.1),
                pcie_rx_bps=self._pcie_bps * r.uniform(0.9, 1.1),
                links_up=links,
                nvlink_link_bps=m.nvlink_link_bytes_per_s * self.node.nvlink_share * r.uniform(0.95, 1.05),
            )
        temp = m.temp_idle_c + self._temp_bias + r.gauss(0, 0.5)
        return GpuState(
            busy=False,
            temp_c=temp,
            mem_temp_c=None if m.mem_temp_offset_c is None else temp + m.mem_temp_offset_c + r.gauss(0, 0.3),
            power_w=m.power_idle_w * r.uniform(0.95, 1.06),
            power_limit_w=m.power_limit_w,
            sm_clock_mhz=m.sm_clock_idle_mhz,
            mem_clock_mhz=m.mem_clock_idle_mhz,
            util_gpu=0,
            util_mem=0,
            mem_used_bytes=m.memory_reserved_bytes,
            reasons=IDLE,
            pcie_gen=m.pcie_gen_idle,
            pcie_width=m.pcie_width_max,
            pcie_tx_bps=r.uniform(500e3, 650e3),  # realdata idle H100: 530-630 KB/s
            pcie_rx_bps=r.uniform(450e3, 600e3),
            links_up=links,
            nvlink_link_bps=r.uniform(0.0, 2e3),  # keep-alive chatter only
        )


class SimNode:
    """N simulated GPUs of one model behind one (simulated) driver."""

    def __init__(
        self,
        name: str = "node-0",
        model: str | GpuModel = "h100",
        gpus: int = 8,
        *,
        workload: str = "busy",
        seed: int = 0,
        driver_version: str = "535.183.01",
        cuda_version: int = 12020,
        faults: list[str | FaultSpec] | None = None,
    ) -> None:
        if workload not in WORKLOADS:
            raise ValueError(f"workload must be one of {WORKLOADS}")
        self.name = name
        self.model = get_model(model)
        self.workload = workload
        self.driver_version = driver_version
        self.cuda_version = cuda_version
        self.lock = threading.RLock()
        self.last_ts: float | None = None
        rng = random.Random(f"{name}/{seed}")
        # A collective moves every GPU of the node at about the same rate.
        self.nvlink_share = rng.uniform(0.25, 0.40)
        self.gpus = [SimGpu(self, i, self.model, random.Random(f"{name}/{seed}/gpu{i}")) for i in range(gpus)]
        self._pids = itertools.count(4000, 7)  # this node's PID namespace
        for spec in faults or ():
            self.apply(spec)

    def gpu(self, index: int) -> SimGpu:
        return self.gpus[index]

    def advance(self, ts: float) -> None:
        """Move the node to sample time `ts` (seconds). Going backwards is ignored."""
        with self.lock:
            if self.last_ts is not None and ts < self.last_ts:
                return
            dt = 0.0 if self.last_ts is None else ts - self.last_ts
            self.last_ts = ts
            for gpu in self.gpus:
                gpu.advance(dt)

    def set_workload(self, workload: str, gpus: list[int] | None = None) -> None:
        if workload not in WORKLOADS:
            raise ValueError(f"workload must be one of {WORKLOADS}")
        with self.lock:
            if gpus is None:
                self.workload = workload
                for gpu in self.gpus:
                    gpu.workload = None
            else:
                for i in gpus:
                    self.gpus[i].workload = workload
            for gpu in self.gpus:
                gpu._refresh()

    # -- processes (what NVML lists, what the node's simulated /proc shows) -----------------
    def run_slurm_job(self, job_id: int | str, name: str | None = None, *, gpus: list[int] | None = None, user: str = "sim",
                      step: int | str = 0, first_task: int = 0) -> list[SimProcess]:
        """Start one rank of a Slurm job step on each of `gpus` (None: all), replacing what ran
        there; task numbers count up from `first_task` (a job spanning nodes numbers on)."""
        return self._run(gpus, lambda i, pid: slurm_process(pid, job_id, name=name, user=user, step=step, task=first_task + i))

    def run_pod(self, pod_uid: str, container_id: str, *, gpus: list[int] | None = None) -> list[SimProcess]:
        """Start one process of a pod's container on each of `gpus` (None: all)."""
        return self._run(gpus, lambda i, pid: k8s_process(pid, pod_uid, container_id))

    def stop_processes(self, gpus: list[int] | None = None) -> None:
        with self.lock:
            for i in range(len(self.gpus)) if gpus is None else gpus:
                self.gpus[i].processes = []

    @property
    def processes(self) -> list[SimProcess]:
        """Every process on this node's GPUs (one entry per PID)."""
        with self.lock:
            return list({p.pid: p for gpu in self.gpus for p in gpu.processes}.values())

    def _run(self, gpus: list[int] | None, make: Callable[[int, int], SimProcess]) -> list[SimProcess]:
        with self.lock:
            started = []
            for n, i in enumerate(range(len(self.gpus)) if gpus is None else gpus):
                proc = make(n, next(self._pids))
                self.gpus[i].processes = [proc]
                started.append(proc)
            return started

    def inject(self, gpu: int | None, name: str, arg: float | None = None) -> None:
        """Inject fault `name` on GPU `gpu` (None: all GPUs)."""
        for g in self.gpus if gpu is None else [self.gpus[gpu]]:
            g.inject(name, arg)

    def clear(self, gpu: int | None = None, name: str | None = None) -> None:
        for g in self.gpus if gpu is None else [self.gpus[gpu]]:
            g.clear(name)

    def apply(self, spec: str | FaultSpec) -> None:
        """Inject a fault from a spec ('gpu3:thermal', '3:xid=79'); its node part is not checked here."""
        if isinstance(spec, str):
            spec = parse_fault_spec(spec)
        self.inject(spec.gpu, spec.name, spec.arg)

    def active_faults(self) -> dict[int, list[Fault]]:
        with self.lock:
            return {g.index: list(g.faults.values()) for g in self.gpus if g.faults}


__all__ = ["GpuState", "Counters", "SimGpu", "SimNode", "WORKLOADS"]
