"""One node's samples, in time order: its GPUs and ports driven by the job's phases, the
fleet's warm-up, the node's own noise events, and the faults injected into it."""

from __future__ import annotations

import hashlib
import math
from random import Random

from bench.fleetgen.faults import Fault
from bench.fleetgen.layout import WORKING, NodeSpec
from bench.fleetgen.models import (HW_POWER_BRAKE, HW_SLOWDOWN, HW_THERMAL, IDLE, SW_POWER_CAP, SW_THERMAL,
                                   SXM_BUS_IDS)

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
                 faults: list[Fault]):
        self.spec = spec
        self.model = spec.model
        self.t0 = t0
        self.dt = interval
        self.cluster = cluster
        self.alpha = 1.0 - math.exp(-interval / TAU_S)
        self.alpha_fast = 1.0 - math.exp(-interval / 4.0)
        # The node's noise comes from its own stream (seeded by fleet seed and node, never by
        # the faults), so the fault-free fleet of a seed has exactly the same noise events.
        rng = self.rng = Random(f"{seed}:node:{spec.idx}")
        self.frng = Random(f"{seed}:faults:{spec.idx}")
        self.faults = [f for f in faults if f.node == spec.name]
        m = self.model
        self.gpus: list[_Gpu] = []
        for i in range(8):
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
        self.noise = self._noise_events(rng, duration)
        # Steady temperatures at t0 for what the node is doing then.
        st = spec.job.state(0.0, interval) if spec.job else "off"
        for g in self.gpus:
            load = 1.0 if st in WORKING else 0.0
            g.temp = self._temp_target(g, load, 0.0)

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

        for g in range(8):
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
        dt = self.dt
        off = k * dt
        ts = self.t0 + off
        job = self.spec.job
        st = job.state(off, dt) if job is not None else "off"
        warm = WARMUP_C_PER_HOUR * min(1.0, off / 3600.0)
        active = [f for f in self.faults if f.start <= ts < f.end] if self.faults else ()
        noise = self.noise.get(k, ())
        gpu_noise = [e for e in noise if e[0] in GPU_NOISE_PER_H or e[0] == "xid_app"] if noise else ()
        gpus = []
        for g in self.gpus:
            fl = [f for f in active if f.gpu == g.index] if active else ()
            rec = self._gpu(g, ts, off, st, warm, fl, gpu_noise)
            if rec is not None:
                gpus.append(rec)
        nics = []
        for i, n in enumerate(self.nics):
            fl = [f for f in active if f.nic == n.device] if active else ()
            nics.append(self._nic(n, i, ts, st, fl, noise))
        return {"ts": ts, "gpus": gpus, "nics": nics}

    def _temp_target(self, g: _Gpu, load: float, warm: float) -> float:
        m = self.model
        return m.temp_idle + (m.temp_busy - m.temp_idle) * load + g.cool + self.spec.rack_offset + warm

    def _gpu(self, g: _Gpu, ts: float, off: float, st: str, warm: float, fl, noise) -> dict | None:
        m, rng, dt, job = self.model, self.rng, self.dt, self.spec.job
        limit = m.power_limit
        for f in fl:
            if f.cause == "lost":
                if f.variant == "vanished":
                    return None
                return {"index": g.index, "uuid": g.uuid, "model": m.name, "pci_bus_id": g.bus, "lost": True}
            if f.variant in ("limit_low", "limit_12pct"):
                limit = float(round(m.power_limit * f.param))

        working = st in WORKING
        pcie_gen, pcie_width = m.pcie_gen_max, 16
        nvl = 0.0
        if working:
            compute = st == "compute"
            demand = m.power_limit * (job.compute_demand if compute else job.comm_demand) * (1.0 + g.leak) * rng.gauss(1.0, 0.005)
            if demand >= limit:
                power = limit * rng.uniform(0.975, 0.998)
                clock = m.sm_max * (limit / demand) ** 0.7
                bits = SW_POWER_CAP
            else:
                power = demand
                clock = m.sm_max - 15 * rng.randint(0, 1)
                bits = 0
            if compute:
                util = 100 - rng.randint(0, 2)
                umem = job.mem_util * rng.gauss(1.0, 0.05)
                nvl = m.nvlink_peak * job.nvlink_frac * job.nvlink_compute
            else:
                util = job.comm_util + rng.randint(-4, 4)
                umem = job.mem_util * 0.4 * rng.gauss(1.0, 0.1)
                nvl = m.nvlink_peak * job.nvlink_frac
            nvl *= rng.gauss(1.0, 0.03)
            pcie = job.pcie_bps * max(0.2, rng.gauss(1.0, 0.2))
            mem_used = int(m.mem_total * (job.mem_frac + g.mem_var))
        elif st == "ckpt_in":  # the pause began within this sample: partly busy, clocks already down
            util, umem, bits = rng.randint(20, 60), rng.uniform(5, 15), 0
            clock, power = m.sm_idle, m.power_idle * rng.uniform(1.8, 2.5)
            pcie = rng.uniform(4e9, 10e9)
            mem_used = int(m.mem_total * (job.mem_frac + g.mem_var))
        elif st == "ckpt_out":  # work resumed within this sample: partly busy, boost clock
            util, umem, bits = rng.randint(30, 65), rng.uniform(5, 20), 0
            clock, power = m.sm_max - 15 * rng.randint(0, 2), limit * rng.uniform(0.35, 0.5)
            pcie = job.pcie_bps * rng.uniform(0.5, 2.0)
            nvl = m.nvlink_peak * job.nvlink_frac * 0.3
            mem_used = int(m.mem_total * (job.mem_frac + g.mem_var))
        elif st == "ckpt":  # checkpoint: the job's GPUs idle while the state is copied out
            util, umem, bits = 0, 0.0, IDLE
            clock, power = m.sm_idle, m.power_idle * rng.uniform(1.05, 1.25)
            pcie = rng.uniform(6e9, 12e9)
            pcie_gen = m.pcie_gen_idle
            mem_used = int(m.mem_total * (job.mem_frac + g.mem_var))
        else:  # no job
            util, umem, bits = 0, 0.0, IDLE
            clock, power = m.sm_idle, m.power_idle * rng.gauss(1.0, 0.03)
            pcie = rng.uniform(2e4, 2e5)
            pcie_gen = m.pcie_gen_idle
            mem_used = m.mem_reserved

        links_up = m.nvlink_links
        target_override = None
        xids = []
        for f in fl:
            c, v, first = f.cause, f.variant, abs(ts - f.start) < dt / 2
            frng = self.frng
            if c == "thermal":
                if working:
                    bits = (bits & ~SW_POWER_CAP) | (HW_THERMAL | HW_SLOWDOWN | SW_THERMAL if v == "hw_thermal" else SW_THERMAL)
                    clock *= f.param
                    power = m.power_idle + (power - m.power_idle) * f.param ** 1.5
                    target_override = (self._temp_target(g, 1.0, warm) + 12.0 if v == "hot"
                                       else (90.0 if v == "hw_thermal" else 86.0) + g.cool * 0.3)
                    g.fast_until = f.end + 30.0
            elif c == "power":
                if v in ("brake", "node_brake"):
                    bits = (bits & ~(IDLE | SW_POWER_CAP)) | HW_SLOWDOWN | HW_POWER_BRAKE
                    clock = m.sm_max * f.param
                    power = m.power_idle * (1.6 if working else 1.0) * frng.uniform(0.97, 1.03)
            elif c == "hw_slowdown":
                bits |= HW_SLOWDOWN
                if working:
                    bits &= ~SW_POWER_CAP
                    clock *= f.param
                    power = m.power_idle + (power - m.power_idle) * f.param ** 1.5
            elif c == "clock":
                if working:
                    bits &= ~SW_POWER_CAP
                    clock *= f.param
                    power = m.power_idle + (power - m.power_idle) * f.param ** 1.5
            elif c == "nvlink":
                if v == "links_down":
                    links_up = m.nvlink_links - int(f.param)
                    nvl *= links_up / m.nvlink_links
                    if first:
                        g.recovery += int(f.param)
                elif working:
                    if v == "crc_rising":
                        g.crc += max(1, _poisson(frng, f.param * dt))
                        g.replay += _poisson(frng, 0.2 * f.param * dt)
                        nvl *= 0.93
                    elif v == "replay_rising":
                        g.replay += max(1, _poisson(frng, f.param * dt))
                        nvl *= 0.9
                    elif v == "bw_low":
                        nvl *= f.param
            elif c == "pcie":
                if v == "gen_down":
                    pcie_gen = min(pcie_gen, m.pcie_gen_max - 2)
                    pcie = min(pcie, 4e9)
                elif v == "width_down":
                    pcie_width = 8
                elif working:
                    g.pcie_replay += max(1, _poisson(frng, f.param * dt))
            elif c == "ecc":
                g.pending = True
                if v == "uncorrected":
                    if first or abs(ts - (f.start + dt * int((f.end - f.start) / dt / 2))) < dt / 2:
                        g.ecc_u += 1
                elif first:
                    g.ecc_c += frng.randint(8, 20)
            elif c == "xid" and first:
                xids.append({"xid": int(f.param), "ts": round(ts - frng.uniform(0.0, dt), 3)})
        if not any(f.cause == "ecc" for f in fl):
            g.pending = False  # rows remapped at the GPU reset that ended the fault

        for kind, who, u in noise:
            if kind == "xid_app":
                # An application error lands on one GPU of a working job, never on a faulty one.
                if working and who == -1 and int(u * 8) == g.index and not self._faulty_near(g.index, ts):
                    xids.append({"xid": APP_XIDS[int(u * 1000) % 3], "ts": round(ts - u * dt, 3)})
            elif who == g.index:
                if kind == "nvlink_crc":
                    g.crc += 1 if u < 0.8 else 2
                elif kind == "pcie_replay":
                    g.pcie_replay += 1
                elif kind == "ecc_corrected":
                    g.ecc_c += 1 if u < 0.7 else 2

        # Temperature: first order towards what the power and the air ask for.
        load = max(0.0, (power - m.power_idle) / (m.power_limit - m.power_idle))
        target = target_override if target_override is not None else self._temp_target(g, load, warm)
        g.temp += (target - g.temp) * (self.alpha_fast if ts < g.fast_until else self.alpha)
        temp = int(round(g.temp + rng.gauss(0.0, 0.4)))

        step_bytes = int(nvl * dt) // 1024 * 1024
        g.nvl_tx += step_bytes
        g.nvl_rx += int(step_bytes * rng.uniform(0.98, 1.02)) // 1024 * 1024
        clock = int(round(clock / 15.0) * 15) if clock >= 300 else int(round(clock))
        return {
            "index": g.index, "uuid": g.uuid, "model": m.name, "pci_bus_id": g.bus,
            "temp_c": float(temp), "mem_temp_c": float(int(round(g.temp + m.mem_temp_offset + rng.gauss(0.0, 0.5)))),
            "power_w": round(power, 2), "power_limit_w": limit,
            "sm_clock_mhz": min(clock, m.sm_max), "sm_clock_max_mhz": m.sm_max,
            "mem_clock_mhz": m.mem_clock, "mem_clock_max_mhz": m.mem_clock,
            "util_gpu_pct": float(max(0, min(100, util))), "util_mem_pct": float(max(0, min(100, int(umem)))),
            "mem_used_bytes": mem_used, "mem_total_bytes": m.mem_total,
            "clocks_event_reasons": bits,
            "pcie_gen": pcie_gen, "pcie_gen_max": m.pcie_gen_max, "pcie_width": pcie_width, "pcie_width_max": 16,
            "pcie_replay_total": g.pcie_replay,
            "pcie_tx_bytes_per_s": float(int(pcie) // 1024 * 1024), "pcie_rx_bytes_per_s": float(int(pcie * 0.3) // 1024 * 1024),
            "nvlink_links_up": links_up, "nvlink_links_total": m.nvlink_links,
            "nvlink_tx_bytes_total": g.nvl_tx, "nvlink_rx_bytes_total": g.nvl_rx,
            "nvlink_crc_errors_total": g.crc, "nvlink_replay_errors_total": g.replay, "nvlink_recovery_errors_total": g.recovery,
            "ecc_corrected_total": g.ecc_c, "ecc_uncorrected_total": g.ecc_u, "remapped_rows_pending": g.pending,
            "xids": xids,
        }

    def _faulty_near(self, gpu: int, ts: float, margin: float = 180.0) -> bool:
        return any(f.gpu == gpu and f.start - margin <= ts < f.end + margin for f in self.faults)

    def _nic(self, n: _Nic, i: int, ts: float, st: str, fl, noise) -> dict:
        rng, dt, job = self.rng, self.dt, self.spec.job
        if st in WORKING:
            comm = st == "comm"
            bps = job.ib_bps * (1.0 if comm else job.ib_compute) * rng.gauss(1.0, 0.05 if comm else 0.1)
            wait = job.wait_per_s * (1.0 if comm else 0.1) * rng.lognormvariate(0.0, 0.3)
        elif st != "off":
            bps = job.ib_bps * 0.02 * rng.uniform(0.5, 1.5)
            wait = job.wait_per_s * 0.01 * rng.random()
        else:
            bps = rng.uniform(2e4, 2e5)
            wait = 0.0
        state, rate = "ACTIVE", 400.0
        for f in fl:
            v, first = f.variant, abs(ts - f.start) < dt / 2
            if v == "port_down":
                state, bps, wait = "DOWN", 0.0, 0.0
                if first:
                    n.downed += 1
            elif v == "rate_200":
                rate = 200.0
                bps *= 0.6 if st in WORKING else 1.0
                if first:
                    n.downed += 1
            elif v == "symbol_errors":
                n.symbol += max(1, _poisson(self.frng, f.param * dt))
                n.rcv += _poisson(self.frng, 0.2 * f.param * dt)
            elif st in WORKING:
                if v == "bw_low":
                    bps *= f.param
                elif v == "xmit_wait":
                    wait *= f.param
                    bps *= 0.8
        for kind, who, u in noise:
            if who == i and kind in NIC_NOISE_PER_H:
                if kind == "ib_symbol":
                    n.symbol += 1
                else:
                    n.rcv += 1
        half = bps * dt / 2
        n.tx += int(half * rng.uniform(0.99, 1.01)) // 4 * 4
        n.rx += int(half * rng.uniform(0.99, 1.01)) // 4 * 4
        n.wait += int(wait * dt)
        return {
            "device": n.device, "port": 1, "state": state, "rate_gbps": rate,
            "tx_bytes_total": n.tx, "rx_bytes_total": n.rx, "symbol_errors_total": n.symbol,
            "link_downed_total": n.downed, "rcv_errors_total": n.rcv, "xmit_discards_total": n.discards,
            "xmit_wait_total": n.wait,
        }
