"""One node's samples, in time order: its GPUs and ports driven by the job's phases, the
fleet's warm-up, the node's own noise events and counter resets, and the faults injected into
it. Gauges are the state at the sample's instant, as NVML reports them; counters integrate the
rates over the time since the node's previous sample (bench/fleetgen/phases.py)."""

from __future__ import annotations

import hashlib
import math
from bisect import bisect_left
from random import Random

from bench.fleetgen.cached import CachedCounters
from bench.fleetgen.faults import Fault
from bench.fleetgen.layout import BUSY, WORKING, NodeSpec
from bench.fleetgen.models import HW_POWER_BRAKE, HW_SLOWDOWN, HW_THERMAL, IDLE, SW_POWER_CAP, SW_THERMAL, SXM_BUS_IDS, Model
from bench.fleetgen.phases import OFF, dot, ib_rates, nvlink_rates, occupancy, state
from bench.fleetgen.serving import demand as serve_demand

WARMUP_C_PER_HOUR = 8.0  # the fleet's inlet air warms this much over the hour
TAU_S = 30.0  # thermal time constant of a GPU and its heatsink
NICS = 8
APP_XIDS = (13, 31, 43)  # application errors: must never be flagged

# Isolated corrected errors, per entity per hour (Poisson, at least 5 min apart): the
# background counters of a healthy fleet (the real H100 dumps show 43-120 PCIe replays since
# reset on healthy GPUs).
GPU_NOISE_PER_H = {"nvlink_crc": 0.25, "pcie_replay": 0.25, "ecc_corrected": 0.15}
NIC_NOISE_PER_H = {"ib_symbol": 0.25, "ib_rcv": 0.05}
APP_XID_PER_NODE_H = 0.12


class _Gpu:
    __slots__ = ("index", "uuid", "bus", "leak", "cool", "mem_var", "temp", "fast_until", "nvl_tx", "nvl_rx", "crc", "replay",
                 "recovery", "pcie_replay", "ecc_c", "ecc_u", "pending")


class _Nic:
    __slots__ = ("device", "tx", "rx", "symbol", "downed", "rcv", "discards", "wait")


class _Tick:
    """What one sample of the node shares across its GPUs and ports."""

    __slots__ = ("ts", "gap", "off", "st", "occ", "warm", "alpha", "alpha_fast", "nvl", "reset")


class _Reading:
    """One GPU's sample as it is being built: the job's state sets it, then its faults change it."""

    __slots__ = ("busy", "limit", "util", "umem", "bits", "clock", "power", "pcie", "pcie_gen", "pcie_width", "mem_used",
                 "links_up", "nvl_factor", "nvl_bytes", "target_override", "xids")

    def __init__(self, m: Model, *, busy: bool, limit: float):
        self.busy = busy
        self.limit = limit
        self.pcie_gen, self.pcie_width = m.pcie_gen_max, 16
        self.links_up = m.nvlink_links
        self.nvl_factor = 1.0
        self.nvl_bytes = None  # NVLink bytes over the interval where the GPU's own work says (else its job's)
        self.target_override = None  # a temperature a fault forces, instead of the power's
        self.xids: list[dict] = []


def _count_gpu_noise(g: _Gpu, kind: str, u: float) -> None:
    if kind == "nvlink_crc":
        g.crc += 1 if u < 0.8 else 2
    elif kind == "pcie_replay":
        g.pcie_replay += 1
    elif kind == "ecc_corrected":
        g.ecc_c += 1 if u < 0.7 else 2


def _uid(*parts) -> str:
    h = hashlib.sha256(":".join(map(str, parts)).encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _poisson(rng: Random, lam: float) -> int:
    if lam <= 0:
        return 0
    if lam > 30:
        return max(0, int(round(rng.gauss(lam, math.sqrt(lam)))))
    limit, k, p = math.exp(-lam), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


class NodeSim:
    def __init__(self, spec: NodeSpec, *, seed: int, cluster: str, t0: float, interval: float, duration: float,
                 faults: list[Fault], times: list[float]):
        """`times`: the node's sample times, all of them (sample(k) takes the k-th)."""
        self.spec = spec
        self.model = spec.model
        self.t0 = t0
        self.dt = interval
        self.times = times
        self.cluster = cluster
        self.nvl_rates = nvlink_rates(spec)
        self.ib_bps, self.ib_wait = ib_rates(spec)
        # The node's noise comes from its own stream (seeded by fleet seed and node, never by
        # the faults), so the fault-free fleet of a seed has exactly the same noise events.
        rng = self.rng = Random(f"{seed}:node:{spec.idx}")
        self.frng = Random(f"{seed}:faults:{spec.idx}")
        self.faults = [f for f in faults if f.node == spec.name]
        # The middle sample of each fault (an uncorrected ECC error counts again there).
        self.fault_mid = {}
        for f in self.faults:
            k0, k1 = bisect_left(times, f.start), bisect_left(times, f.end)
            self.fault_mid[f.id] = times[min(len(times) - 1, k0 + (k1 - k0) // 2)]
        m = self.model
        self.gpus: list[_Gpu] = []
        for i in range(spec.gpus):
            g = _Gpu()
            g.index = i
            g.uuid = _uid(seed, cluster, spec.name, i)
            g.bus = f"00000000:{SXM_BUS_IDS[i]}:00.0"
            g.leak = max(-0.04, min(0.04, rng.gauss(0.0, 0.018)))  # silicon: ±1-2% sustained clock at the cap
            g.cool = max(-3.0, min(3.0, rng.gauss(0.0, 1.4)))  # cooling spread, °C
            g.mem_var = rng.uniform(-0.01, 0.02)
            g.temp = m.temp_idle + g.cool + spec.rack_offset
            g.fast_until = -1.0
            g.nvl_tx = g.nvl_rx = rng.randrange(1 << 40, 1 << 44) // 1024 * 1024
            g.crc = rng.randrange(0, 40)
            g.replay = rng.randrange(0, 10)
            g.recovery = rng.randrange(0, 3)
            g.pcie_replay = rng.randrange(40, 125)
            g.ecc_c = rng.randrange(0, 30)
            g.ecc_u = 0
            g.pending = False
            self.gpus.append(g)
        self.nics: list[_Nic] = []
        for i in range(NICS):
            n = _Nic()
            n.device = f"mlx5_{i}"
            n.tx = n.rx = rng.randrange(1 << 40, 1 << 46) // 4 * 4
            n.symbol = rng.randrange(0, 5)
            n.downed = rng.randrange(0, 3)
            n.rcv = rng.randrange(0, 5)
            n.discards = rng.randrange(0, 100)
            n.wait = rng.randrange(1 << 30, 1 << 36)
            self.nics.append(n)
        self.cache = CachedCounters(*spec.cached_counters) if spec.cached_counters is not None else None
        self.noise = self._noise_events(rng, duration)
        # Steady temperatures at the first sample for what the node is doing then.
        first = min(bisect_left(times, t0 + spec.appear), len(times) - 1)
        off = times[first] - t0
        st = state(spec, off, off)
        load = 1.0 if st in WORKING else 0.6 if st == "eval" else 0.0
        for g in self.gpus:
            g.temp = self._temp_target(g, load, WARMUP_C_PER_HOUR * min(1.0, off / 3600.0))

    # --- noise ------------------------------------------------------------------------------

    def _noise_events(self, rng: Random, duration: float) -> dict[int, list[tuple]]:
        events: dict[int, list[tuple]] = {}

        def process(rate_per_h: float, kind: str, who: int, min_gap: float = 300.0) -> None:
            t, last = 0.0, -1e9
            while True:
                t += rng.expovariate(rate_per_h / 3600.0)
                if t >= duration:
                    return
                if t - last >= min_gap:
                    events.setdefault(int(t / self.dt), []).append((kind, who, rng.random()))
                    last = t

        for g in range(self.spec.gpus):
            for kind, rate in GPU_NOISE_PER_H.items():
                process(rate, kind, g)
        for n in range(NICS):
            for kind, rate in NIC_NOISE_PER_H.items():
                process(rate, kind, n)
        if self.spec.job is not None:
            process(APP_XID_PER_NODE_H, "xid_app", -1, 60.0)
        return events

    # --- one sample ---------------------------------------------------------------------------

    def sample(self, k: int) -> dict:
        ts = self.times[k]
        prev = self.times[k - 1] if k else ts - self.dt
        spec = self.spec
        t = _Tick()
        t.ts, t.gap, t.off = ts, ts - prev, ts - self.t0
        poff = prev - self.t0
        t.st = state(spec, t.off, poff)
        t.occ = occupancy(spec, poff, t.off)
        t.nvl = dot(t.occ, self.nvl_rates)
        t.warm = WARMUP_C_PER_HOUR * min(1.0, t.off / 3600.0)
        t.alpha = 1.0 - math.exp(-t.gap / TAU_S)
        t.alpha_fast = 1.0 - math.exp(-t.gap / 4.0)
        t.reset = spec.gpu_reset is not None and poff < spec.gpu_reset <= t.off
        active = [f for f in self.faults if f.start <= ts < f.end] if self.faults else ()
        noise = self.noise.get(k, ())
        gpu_noise = [e for e in noise if e[0] in GPU_NOISE_PER_H or e[0] == "xid_app"] if noise else ()
        gpus = []
        for g in self.gpus:
            fl = [f for f in active if f.gpu == g.index] if active else ()
            rec = self._gpu(g, t, fl, gpu_noise)
            if rec is not None:
                gpus.append(rec)
        ib_reset = spec.ib_reset if spec.ib_reset is not None and poff < spec.ib_reset[1] <= t.off else None
        nics = []
        for i, n in enumerate(self.nics):
            fl = [f for f in active if f.nic == n.device] if active else ()
            if ib_reset is not None and ib_reset[0] == n.device:
                n.tx = n.rx = n.symbol = n.downed = n.rcv = n.discards = n.wait = 0
            nics.append(self._nic(n, i, t, fl, noise))
        return {"ts": ts, "gpus": gpus, "nics": nics}

    def _temp_target(self, g: _Gpu, load: float, warm: float) -> float:
        m = self.model
        return m.temp_idle + (m.temp_busy - m.temp_idle) * load + g.cool + self.spec.rack_offset + warm

    def _gpu(self, g: _Gpu, t: _Tick, fl, noise) -> dict | None:
        if t.reset:  # the driver came back: every NVML counter of the GPU starts again
            g.nvl_tx = g.nvl_rx = g.crc = g.replay = g.recovery = g.pcie_replay = g.ecc_c = g.ecc_u = 0
            g.pending = False
        for f in fl:
            if f.cause == "lost":
                return self._lost(g, f)
        r = _Reading(self.model, busy=t.st in BUSY, limit=self._power_limit(fl))
        self._load(g, r, t.st, t.off, t.gap)
        for f in fl:
            effect = self._FAULT_EFFECTS.get(f.cause)
            if effect is not None:
                effect(self, g, r, f, t)
        if not any(f.cause == "ecc" for f in fl):
            g.pending = False  # rows remapped at the GPU reset that ended the fault
        self._gpu_noise(g, r, t, noise)
        return self._gpu_record(g, r, t)

    def _lost(self, g: _Gpu, f: Fault) -> dict | None:
        if f.variant == "vanished":
            return None
        return {"index": g.index, "uuid": g.uuid, "model": self.model.name, "pci_bus_id": g.bus, "lost": True}

    def _power_limit(self, fl) -> float:
        limit = self.model.power_limit
        for f in fl:
            if f.variant in ("limit_low", "limit_12pct"):
                limit = float(round(self.model.power_limit * f.param))
        return limit

    # --- what the GPU does in each state of its job -----------------------------------------

    def _load(self, g: _Gpu, r: _Reading, st: str, off: float, gap: float) -> None:
        if self.spec.serving is not None:
            self._serve_load(g, r, off, gap)
        elif r.busy:
            self._busy_load(g, r, st)
        elif st == "ckpt_in":
            self._ckpt_in_load(g, r)
        elif st == "ckpt_out":
            self._ckpt_out_load(g, r)
        elif st == "ckpt":
            self._ckpt_load(g, r)
        else:
            self._no_job_load(r)

    def _job_mem_used(self, g: _Gpu) -> int:
        return int(self.model.mem_total * (self.spec.job.mem_frac + g.mem_var))

    def _busy_load(self, g: _Gpu, r: _Reading, st: str) -> None:
        self._busy_power(g, r, st)
        self._busy_utilisation(r, st)
        r.pcie = self.spec.job.pcie_bps * max(0.2, self.rng.gauss(1.0, 0.2))
        r.mem_used = self._job_mem_used(g)

    def _busy_power(self, g: _Gpu, r: _Reading, st: str) -> None:
        m, rng, job = self.model, self.rng, self.spec.job
        demand = job.compute_demand if st == "compute" else job.comm_demand if st == "comm" else job.eval_demand
        self._draw(r, demand * m.power_limit * (1.0 + g.leak) * rng.gauss(1.0, 0.005))

    def _draw(self, r: _Reading, want: float) -> None:
        """Power, clock and bits of a busy GPU whose work would draw `want` W at max clock: on
        the cap (SW power cap bit, the clock down) where that is above its limit."""
        m, rng = self.model, self.rng
        if want >= r.limit:
            r.power = r.limit * rng.uniform(0.975, 0.998)
            r.clock = m.sm_max * (r.limit / want) ** 0.7
            r.bits = SW_POWER_CAP
        else:
            r.power = want
            r.clock = m.sm_max - 15 * rng.randint(0, 1)
            r.bits = 0

    def _busy_utilisation(self, r: _Reading, st: str) -> None:
        rng, job = self.rng, self.spec.job
        if st == "compute":
            r.util = 100 - rng.randint(0, 2)
            r.umem = job.mem_util * rng.gauss(1.0, 0.05)
        elif st == "comm":
            r.util = job.comm_util + rng.randint(-4, 4)
            r.umem = job.mem_util * 0.4 * rng.gauss(1.0, 0.1)
        else:  # evaluation: forward passes, lighter and below the cap
            r.util = job.eval_util + rng.randint(-5, 5)
            r.umem = job.mem_util * 0.6 * rng.gauss(1.0, 0.1)

    def _serve_load(self, g: _Gpu, r: _Reading, off: float, gap: float) -> None:
        """A serving GPU (bench/fleetgen/serving.py): its own load level, not its job's phase."""
        m, rng, serving = self.model, self.rng, self.spec.serving
        level = serving.level(g.index, off)
        r.mem_used = int(m.mem_total * serving.mem_frac[g.index])
        if level < 0.1:  # a quiet replica: the model loaded, no requests
            r.busy, r.util, r.umem, r.bits = False, round(100 * level), 0.0, IDLE
            r.clock, r.power = m.sm_idle, m.power_idle * rng.uniform(1.05, 1.2)
            r.pcie = rng.uniform(2e4, 2e5)
            return
        r.busy = True
        self._draw(r, serve_demand(level) * m.power_limit * (1.0 + g.leak) * rng.gauss(1.0, 0.03))
        r.util = max(10, min(100, round(100 * level * rng.gauss(1.0, 0.04))))
        r.umem = 45.0 * level * rng.gauss(1.0, 0.1)
        r.pcie = 2e9 * level * max(0.2, rng.gauss(1.0, 0.3))
        r.nvl_bytes = m.nvlink_peak * serving.nvlink_frac(g.index) * level * gap

    def _ckpt_in_load(self, g: _Gpu, r: _Reading) -> None:
        """The pause began within this sample: partly busy, clocks already down."""
        m, rng = self.model, self.rng
        r.util, r.umem, r.bits = rng.randint(20, 60), rng.uniform(5, 15), 0
        r.clock, r.power = m.sm_idle, m.power_idle * rng.uniform(1.8, 2.5)
        r.pcie = rng.uniform(4e9, 10e9)
        r.mem_used = self._job_mem_used(g)

    def _ckpt_out_load(self, g: _Gpu, r: _Reading) -> None:
        """Work resumed within this sample: partly busy, boost clock."""
        m, rng = self.model, self.rng
        r.util, r.umem, r.bits = rng.randint(30, 65), rng.uniform(5, 20), 0
        r.clock, r.power = m.sm_max - 15 * rng.randint(0, 2), r.limit * rng.uniform(0.35, 0.5)
        r.pcie = self.spec.job.pcie_bps * rng.uniform(0.5, 2.0)
        r.mem_used = self._job_mem_used(g)

    def _ckpt_load(self, g: _Gpu, r: _Reading) -> None:
        """Checkpoint: the job's GPUs idle while the state is copied out."""
        m, rng = self.model, self.rng
        r.util, r.umem, r.bits = 0, 0.0, IDLE
        r.clock, r.power = m.sm_idle, m.power_idle * rng.uniform(1.05, 1.25)
        r.pcie = rng.uniform(6e9, 12e9)
        r.pcie_gen = m.pcie_gen_idle
        r.mem_used = self._job_mem_used(g)

    def _no_job_load(self, r: _Reading) -> None:
        m, rng = self.model, self.rng
        r.util, r.umem, r.bits = 0, 0.0, IDLE
        r.clock, r.power = m.sm_idle, m.power_idle * rng.gauss(1.0, 0.03)
        r.pcie = rng.uniform(2e4, 2e5)
        r.pcie_gen = m.pcie_gen_idle
        r.mem_used = m.mem_reserved

    # --- what each fault cause does to the GPU's reading -----------------------------------

    def _slow_down(self, r: _Reading, factor: float) -> None:
        """SM clock times `factor`; the power above idle falls faster than the clock."""
        r.clock *= factor
        r.power = self.model.power_idle + (r.power - self.model.power_idle) * factor ** 1.5

    def _thermal_fault(self, g: _Gpu, r: _Reading, f: Fault, t: _Tick) -> None:
        if not r.busy:
            return
        v = f.variant
        r.bits = (r.bits & ~SW_POWER_CAP) | (HW_THERMAL | HW_SLOWDOWN | SW_THERMAL if v == "hw_thermal" else SW_THERMAL)
        self._slow_down(r, f.param)
        r.target_override = (self._temp_target(g, 1.0, t.warm) + 12.0 if v == "hot"
                             else (90.0 if v == "hw_thermal" else 86.0) + g.cool * 0.3)
        g.fast_until = f.end + 30.0

    def _power_fault(self, g: _Gpu, r: _Reading, f: Fault, t: _Tick) -> None:
        if f.variant not in ("brake", "node_brake"):
            return  # a lowered limit: already in the reading's limit
        m = self.model
        r.bits = (r.bits & ~(IDLE | SW_POWER_CAP)) | HW_SLOWDOWN | HW_POWER_BRAKE
        r.clock = m.sm_max * f.param
        r.power = m.power_idle * (1.6 if r.busy else 1.0) * self.frng.uniform(0.97, 1.03)

    def _hw_slowdown_fault(self, g: _Gpu, r: _Reading, f: Fault, t: _Tick) -> None:
        r.bits |= HW_SLOWDOWN
        if r.busy:
            r.bits &= ~SW_POWER_CAP
            self._slow_down(r, f.param)

    def _clock_fault(self, g: _Gpu, r: _Reading, f: Fault, t: _Tick) -> None:
        if r.busy:
            r.bits &= ~SW_POWER_CAP
            self._slow_down(r, f.param)

    def _nvlink_fault(self, g: _Gpu, r: _Reading, f: Fault, t: _Tick) -> None:
        v = f.variant
        if v == "links_down":
            r.links_up = self.model.nvlink_links - int(f.param)
            r.nvl_factor *= r.links_up / self.model.nvlink_links
            if t.ts == f.start:
                g.recovery += int(f.param)
        elif v == "bw_low":
            r.nvl_factor *= f.param
        elif r.busy:
            self._nvlink_errors(g, r, f, t)

    def _nvlink_errors(self, g: _Gpu, r: _Reading, f: Fault, t: _Tick) -> None:
        frng = self.frng
        if f.variant == "crc_rising":
            g.crc += max(1, _poisson(frng, f.param * t.gap))
            g.replay += _poisson(frng, 0.2 * f.param * t.gap)
            r.nvl_factor *= 0.93
        elif f.variant == "replay_rising":
            g.replay += max(1, _poisson(frng, f.param * t.gap))
            r.nvl_factor *= 0.9

    def _pcie_fault(self, g: _Gpu, r: _Reading, f: Fault, t: _Tick) -> None:
        v = f.variant
        if v == "gen_down":
            r.pcie_gen = min(r.pcie_gen, self.model.pcie_gen_max - 2)
            r.pcie = min(r.pcie, 4e9)
        elif v == "width_down":
            r.pcie_width = 8
        elif r.busy:
            g.pcie_replay += max(1, _poisson(self.frng, f.param * t.gap))

    def _ecc_fault(self, g: _Gpu, r: _Reading, f: Fault, t: _Tick) -> None:
        first = t.ts == f.start
        g.pending = True
        if f.variant == "uncorrected":
            if first or t.ts == self.fault_mid[f.id]:
                g.ecc_u += 1
        elif first:
            g.ecc_c += self.frng.randint(8, 20)

    def _xid_fault(self, g: _Gpu, r: _Reading, f: Fault, t: _Tick) -> None:
        if t.ts == f.start:
            r.xids.append({"xid": int(f.param), "ts": round(t.ts - self.frng.uniform(0.0, t.gap), 3)})

    # A lost GPU reports nothing else (_gpu returns before these); a port's faults are _nic's.
    _FAULT_EFFECTS = {
        "thermal": _thermal_fault, "power": _power_fault, "hw_slowdown": _hw_slowdown_fault, "clock": _clock_fault,
        "nvlink": _nvlink_fault, "pcie": _pcie_fault, "ecc": _ecc_fault, "xid": _xid_fault,
    }

    # --- the healthy fleet's noise, and the record ------------------------------------------

    def _gpu_noise(self, g: _Gpu, r: _Reading, t: _Tick, noise) -> None:
        for kind, who, u in noise:
            if kind == "xid_app":
                # An application error lands on one GPU of a working job, never on a faulty one.
                if r.busy and who == -1 and int(u * 8) == g.index and not self._faulty_near(g.index, t.ts):
                    r.xids.append({"xid": APP_XIDS[int(u * 1000) % 3], "ts": round(t.ts - u * t.gap, 3)})
            elif who == g.index:
                _count_gpu_noise(g, kind, u)

    def _settle_temp(self, g: _Gpu, r: _Reading, t: _Tick) -> int:
        """The GPU's temperature after this sample's interval, as the sensor reads it."""
        m = self.model
        # Temperature: first order towards what the power and the air ask for.
        load = max(0.0, (r.power - m.power_idle) / (m.power_limit - m.power_idle))
        target = r.target_override if r.target_override is not None else self._temp_target(g, load, t.warm)
        g.temp += (target - g.temp) * (t.alpha_fast if t.ts < g.fast_until else t.alpha)
        return int(round(g.temp + self.rng.gauss(0.0, 0.4)))

    def _move_nvlink(self, g: _Gpu, r: _Reading, t: _Tick) -> None:
        rng = self.rng
        moved = int((t.nvl if r.nvl_bytes is None else r.nvl_bytes) * r.nvl_factor * rng.gauss(1.0, 0.03)) // 1024 * 1024
        g.nvl_tx += moved
        g.nvl_rx += int(moved * rng.uniform(0.98, 1.02)) // 1024 * 1024

    def _gpu_record(self, g: _Gpu, r: _Reading, t: _Tick) -> dict:
        m, rng = self.model, self.rng
        temp = self._settle_temp(g, r, t)
        self._move_nvlink(g, r, t)
        clock = int(round(r.clock / 15.0) * 15) if r.clock >= 300 else int(round(r.clock))
        return {
            "index": g.index, "uuid": g.uuid, "model": m.name, "pci_bus_id": g.bus,
            "temp_c": float(temp), "mem_temp_c": float(int(round(g.temp + m.mem_temp_offset + rng.gauss(0.0, 0.5)))),
            "power_w": round(r.power, 2), "power_limit_w": r.limit,
            "sm_clock_mhz": min(clock, m.sm_max), "sm_clock_max_mhz": m.sm_max,
            "mem_clock_mhz": m.mem_clock, "mem_clock_max_mhz": m.mem_clock,
            "util_gpu_pct": float(max(0, min(100, r.util))), "util_mem_pct": float(max(0, min(100, int(r.umem)))),
            "mem_used_bytes": r.mem_used, "mem_total_bytes": m.mem_total,
            "clocks_event_reasons": r.bits,
            "pcie_gen": r.pcie_gen, "pcie_gen_max": m.pcie_gen_max, "pcie_width": r.pcie_width, "pcie_width_max": 16,
            "pcie_replay_total": g.pcie_replay,
            "pcie_tx_bytes_per_s": float(int(r.pcie) // 1024 * 1024), "pcie_rx_bytes_per_s": float(int(r.pcie * 0.3) // 1024 * 1024),
            "nvlink_links_up": r.links_up, "nvlink_links_total": m.nvlink_links,
            "nvlink_tx_bytes_total": self._shown(("nvl_tx", f"gpu{g.index}"), t.ts, g.nvl_tx),
            "nvlink_rx_bytes_total": self._shown(("nvl_rx", f"gpu{g.index}"), t.ts, g.nvl_rx),
            "nvlink_crc_errors_total": g.crc, "nvlink_replay_errors_total": g.replay, "nvlink_recovery_errors_total": g.recovery,
            "ecc_corrected_total": g.ecc_c, "ecc_uncorrected_total": g.ecc_u, "remapped_rows_pending": g.pending,
            "xids": r.xids,
        }

    def _shown(self, key: tuple, ts: float, true: int) -> int:
        return true if self.cache is None else self.cache.shown(key, ts, true)

    def _faulty_near(self, gpu: int, ts: float, margin: float = 180.0) -> bool:
        return any(f.gpu == gpu and f.start - margin <= ts < f.end + margin for f in self.faults)

    def _nic(self, n: _Nic, i: int, t: _Tick, fl, noise) -> dict:
        rng, occ = self.rng, t.occ
        # Bytes and wait ticks over the interval: each state's rate times the time spent in it.
        moved = dot(occ, self.ib_bps) * rng.gauss(1.0, 0.05) + occ[OFF] * rng.uniform(2e4, 2e5)
        wait = dot(occ, self.ib_wait) * rng.lognormvariate(0.0, 0.3)
        state, rate = "ACTIVE", 400.0
        for f in fl:
            v, first = f.variant, t.ts == f.start
            if v == "port_down":
                state, moved, wait = "DOWN", 0.0, 0.0
                if first:
                    n.downed += 1
            elif v == "rate_200":
                rate = 200.0
                moved *= 0.6
                if first:
                    n.downed += 1
            elif v == "symbol_errors":
                n.symbol += max(1, _poisson(self.frng, f.param * t.gap))
                n.rcv += _poisson(self.frng, 0.2 * f.param * t.gap)
            elif v == "bw_low":
                moved *= f.param
            elif v == "xmit_wait":
                wait *= f.param
                moved *= 0.8
        for kind, who, u in noise:
            if who == i and kind in NIC_NOISE_PER_H:
                if kind == "ib_symbol":
                    n.symbol += 1
                else:
                    n.rcv += 1
        half = moved / 2
        n.tx += int(half * rng.uniform(0.99, 1.01)) // 4 * 4
        n.rx += int(half * rng.uniform(0.99, 1.01)) // 4 * 4
        n.wait += int(wait)
        return {
            "device": n.device, "port": 1, "state": state, "rate_gbps": rate,
            "tx_bytes_total": self._shown(("tx", n.device), t.ts, n.tx), "rx_bytes_total": self._shown(("rx", n.device), t.ts, n.rx),
            "symbol_errors_total": n.symbol,
            "link_downed_total": n.downed, "rcv_errors_total": n.rcv, "xmit_discards_total": n.discards,
            "xmit_wait_total": n.wait,
        }
