"""The fault catalogue and the schedule of injected faults (the ground truth).

Every cause the detector reports has overt variants (a reason bit, a link down, an error
counter climbing) and, where the hardware allows it, subtle ones that only a comparison with
peers reveals (a GPU capped 12% below its peers with only the routine power-cap bit, NVLink or
InfiniBand throughput 40% below its peers with no error)."""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass
from random import Random

from bench.fleetgen.layout import Layout, NodeSpec

CAUSES = ("thermal", "power", "hw_slowdown", "clock", "nvlink", "pcie", "network", "xid", "ecc", "lost")
# Causes a fault can have on a node that runs no job (the others need a busy GPU or port).
ANY_NODE_CAUSES = frozenset({"xid", "ecc", "lost"})


@dataclass(frozen=True)
class Variant:
    cause: str
    name: str
    subtle: bool
    what: str
    event: bool = False  # a one-off event (XID): one sample carries it
    node_wide: bool = False  # every GPU of the node (one ground-truth fault per GPU)
    nic: bool = False  # a port of the node; the fault is node-level (gpu None)


VARIANTS: tuple[Variant, ...] = (
    Variant("thermal", "hw_thermal", False, "HW + SW thermal slowdown bits (0x68), ~90 °C, SM clock halved"),
    Variant("thermal", "sw_thermal", False, "SW thermal slowdown bit (0x20), ~86 °C, SM clock -20%"),
    Variant("thermal", "hot", True, "12 °C hotter than usual, SW thermal bit, SM clock -8%"),
    Variant("power", "brake", False, "HW power brake (0x88), SM clock ~5% of max, idle bit gone"),
    Variant("power", "node_brake", False, "HW power brake on all 8 GPUs of a node", node_wide=True),
    Variant("power", "limit_low", False, "enforced power limit 35% below peers"),
    Variant("power", "limit_12pct", True, "enforced power limit 12% below peers, only the routine SW power cap bit"),
    Variant("hw_slowdown", "hw_slowdown", False, "HW slowdown bit (0x8) alone, SM clock x0.45-0.6"),
    Variant("clock", "clock_12", True, "SM clock 12% below peers, no reason bit"),
    Variant("clock", "clock_20", False, "SM clock 20% below peers, no reason bit"),
    Variant("clock", "clock_30", False, "SM clock 30% below peers, no reason bit"),
    Variant("nvlink", "links_down", False, "2 NVLinks down (recovery errors at the start)"),
    Variant("nvlink", "crc_rising", False, "NVLink CRC errors rising 1-8/s, every sample (and replays)"),
    Variant("nvlink", "replay_rising", False, "NVLink replay errors rising 1-8/s, every sample"),
    Variant("nvlink", "bw_low", True, "NVLink throughput 40% below peers, no error"),
    Variant("pcie", "gen_down", False, "PCIe link trained 2 generations below max (busy or idle)"),
    Variant("pcie", "width_down", False, "PCIe link x8 instead of x16"),
    Variant("pcie", "replays_rising", False, "PCIe replays rising 1-8/s while busy, every sample"),
    Variant("network", "port_down", False, "IB port DOWN (link_downed +1)", nic=True),
    Variant("network", "rate_200", False, "IB port at 200 Gb/s instead of 400 (link_downed +1)", nic=True),
    Variant("network", "symbol_errors", False, "IB symbol errors rising 1-8/s, every sample", nic=True),
    Variant("network", "bw_low", True, "IB port throughput 40% below peers, no error", nic=True),
    Variant("network", "xmit_wait", True, "IB port_xmit_wait 20-60x peers while busy, throughput -20%", nic=True),
    Variant("xid", "xid79", False, "XID 79 (fallen off the bus)", event=True),
    Variant("xid", "xid48", False, "XID 48 (double-bit ECC)", event=True),
    Variant("xid", "xid74", False, "XID 74 (NVLink error)", event=True),
    Variant("xid", "xid94", False, "XID 94 (contained ECC error)", event=True),
    Variant("xid", "xid119", False, "XID 119 (GSP RPC timeout)", event=True),
    Variant("ecc", "uncorrected", False, "uncorrected ECC count +1 (+1 later), remapped rows pending"),
    Variant("ecc", "remap_pending", False, "remapped rows pending after a burst of corrected errors"),
    Variant("lost", "lost_flag", False, "GPU reports lost (NVML_ERROR_GPU_IS_LOST), metrics null"),
    Variant("lost", "vanished", False, "GPU missing from its node's samples while the node reports"),
)
VARIANT = {(v.cause, v.name): v for v in VARIANTS}


@dataclass(frozen=True)
class Fault:
    """One injected fault: the ground truth the scorer matches reported episodes against."""

    id: str
    cluster: str
    node: str
    gpu: int | None  # None: node-level (network)
    nic: str | None  # the port, for network faults
    cause: str
    variant: str
    subtle: bool
    start: float  # sample time of the first faulty sample
    end: float  # the node's first sample time after the last faulty sample (its next sample for an event)
    param: float = 0.0  # the variant's magnitude (clock factor, limit fraction, XID code, ...)

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def plan(faults_per_cause: int) -> list[Variant]:
    """Which variants to inject: `faults_per_cause` per cause, cycling through its variants
    (the node-wide power brake at most once: it is eight faults)."""
    out = []
    for cause in CAUSES:
        variants = [v for v in VARIANTS if v.cause == cause]
        i, chosen, used_node_wide = 0, [], False
        while len(chosen) < faults_per_cause:
            v = variants[i % len(variants)]
            i += 1
            if v.node_wide:
                if used_node_wide:
                    continue
                used_node_wide = True
            chosen.append(v)
        out += chosen
    return out


def schedule(layout: Layout, *, cluster: str, t0: float, duration: float, interval: float, faults_per_cause: int,
             rng: Random, times: list[list[float]]) -> list[Fault]:
    """Place the planned faults on nodes and times: each lasting 3-8 minutes, never two at
    once on one node (2.5 min apart at least), never starting within a pause or its edges,
    away from the node's counter resets and agent outage, at most ceil(n/2) of a job's n
    nodes faulty at once, the first after the detector has had 4 minutes of the node's data.

    `times[i]` are node i's sample times: a fault starts on one of them (its first faulty
    sample) and ends on a later one (the first sample after it)."""
    variants = plan(faults_per_cause)
    rng.shuffle(variants)
    busy_by_node: dict[int, list[tuple[float, float]]] = {n.idx: [] for n in layout.nodes}
    faults: list[Fault] = []
    gap = 150.0
    for n_fault, v in enumerate(variants):
        for _attempt in range(1000):
            length = 0.0 if v.event else min(rng.uniform(180.0, 480.0), duration / 4)
            lo = max(240.0, 0.1 * duration)
            hi = duration - length - max(60.0, 0.05 * duration)
            if hi <= lo:
                break
            wanted = rng.uniform(lo, hi)
            node = rng.choice(layout.nodes)
            ts = times[node.idx]
            k = bisect_left(ts, t0 + wanted)
            k_end = k + (1 if v.event else max(1, round(length / interval)))
            if k_end >= len(ts) or ts[k] - t0 < node.appear + 240.0:
                continue
            start, end = ts[k] - t0, ts[k_end] - t0
            job = node.job
            if job is None:
                if v.cause not in ANY_NODE_CAUSES:
                    continue
            else:
                span = node.span
                if not (span[0] + 120 <= start and end <= span[1] - 30) or node.in_pause(start, 3 * interval):
                    continue
            if any(a - gap < end and start < b + gap for a, b in busy_by_node[node.idx] + node.quiet()):
                continue
            if job is not None:
                # Peers stay a clear majority: at most ceil(n/2) of a job's n nodes with a
                # fault at once (one GPU or port each, a small part of the peer group), and a
                # node-wide fault alone in its job.
                limit = 1 if v.node_wide else max(1, (len(job.nodes) + 1) // 2)
                concurrent = sum(1 for i in job.nodes if i != node.idx
                                 for a, b in busy_by_node[i] if a - gap < end and start < b + gap)
                if concurrent >= limit:
                    continue
            busy_by_node[node.idx].append((start, end))
            faults += _make(v, n_fault, cluster, node, ts[k], ts[k_end], rng)
            break
    faults.sort(key=lambda f: (f.start, f.node, -1 if f.gpu is None else f.gpu))
    return faults


def _make(v: Variant, n: int, cluster: str, spec: NodeSpec, start: float, end: float, rng: Random) -> list[Fault]:
    fid, node = f"f{n:03d}", spec.name
    gpu = rng.randrange(spec.gpus)
    nic = f"mlx5_{rng.randrange(8)}"
    param = {
        "hw_thermal": 0.5, "sw_thermal": 0.8, "hot": 0.92,
        "brake": rng.uniform(0.04, 0.07), "node_brake": rng.uniform(0.04, 0.07),
        "limit_low": 0.65, "limit_12pct": 0.88,
        "hw_slowdown": rng.uniform(0.45, 0.6),
        "clock_12": 0.88, "clock_20": 0.8, "clock_30": 0.7,
        "links_down": 2, "bw_low": 0.6,
        # Error rates per second (log-uniform 1-8/s): from a marginal link to a failing one.
        "crc_rising": math.exp(rng.uniform(0.0, math.log(8.0))), "replay_rising": math.exp(rng.uniform(0.0, math.log(8.0))),
        "replays_rising": math.exp(rng.uniform(0.0, math.log(8.0))), "symbol_errors": math.exp(rng.uniform(0.0, math.log(8.0))),
        "xmit_wait": rng.uniform(20.0, 60.0),
        "xid79": 79, "xid48": 48, "xid74": 74, "xid94": 94, "xid119": 119,
    }.get(v.name, 0.0)
    if v.node_wide:
        return [Fault(f"{fid}/g{g}", cluster, node, g, None, v.cause, v.name, v.subtle, start, end, param) for g in range(spec.gpus)]
    if v.nic:
        return [Fault(fid, cluster, node, None, nic, v.cause, v.name, v.subtle, start, end, param)]
    return [Fault(fid, cluster, node, gpu, None, v.cause, v.name, v.subtle, start, end, param)]
