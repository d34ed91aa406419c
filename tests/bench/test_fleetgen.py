"""The fleet generator (bench/fleetgen): deterministic by seed, valid protocol v1, and its
ground truth is what the samples show; its sampling, counters, churn and delivery are a real
fleet's, not a grid's."""

from __future__ import annotations

import json
import math
from bisect import bisect_left
from collections import defaultdict
from pathlib import Path

import jsonschema
import orjson
import pytest

from bench.detection import score
from bench.fleetgen import CAUSES, VARIANTS, Fault, Fleet, FleetConfig
from bench.fleetgen.models import HW_POWER_BRAKE, HW_SLOWDOWN, HW_THERMAL, IDLE, SW_POWER_CAP, SW_THERMAL
from bench.fleetgen.phases import state
from bench.fleetgen.sim import APP_XIDS

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "docs" / "protocol.schema.json").read_text())
SMALL = FleetConfig(nodes=8, interval=5.0, duration=1800.0, seed=3, t0=1_700_000_000.0, faults_per_cause=3)
GPU_COUNTERS = ("pcie_replay_total", "nvlink_tx_bytes_total", "nvlink_rx_bytes_total", "nvlink_crc_errors_total",
                "nvlink_replay_errors_total", "nvlink_recovery_errors_total", "ecc_corrected_total", "ecc_uncorrected_total")
NIC_COUNTERS = ("tx_bytes_total", "rx_bytes_total", "symbol_errors_total", "link_downed_total", "rcv_errors_total",
                "xmit_discards_total", "xmit_wait_total")


def _bodies(cfg: FleetConfig, batch: int = 6) -> list[dict]:
    return [body for _, body in Fleet(cfg).batches(batch)]


def _by_node(fleet: Fleet, batch: int) -> dict[str, list[dict]]:
    samples: dict[str, list[dict]] = defaultdict(list)
    for _, body in fleet.batches(batch):
        samples[body["node"]].extend(body["samples"])
    return samples


@pytest.fixture(scope="module")
def small():
    """The small fleet, its truth, and every node's samples in time order."""
    fleet = Fleet(SMALL)
    samples: dict[str, list[dict]] = defaultdict(list)
    bodies = []
    for _, body in fleet.batches(6):
        bodies.append(body)
        samples[body["node"]].extend(body["samples"])
    return fleet, samples, bodies


def test_same_seed_same_fleet_other_seed_other_fleet():
    a, b = Fleet(SMALL), Fleet(SMALL)
    assert a.truth == b.truth and a.truth
    bodies_a = [(t, orjson.dumps(body)) for t, _, body in a.bodies(6)]
    assert bodies_a == [(t, orjson.dumps(body)) for t, _, body in b.bodies(6)]
    assert bodies_a == [(t, orjson.dumps(body)) for t, _, body in a.bodies(6)]  # each pass starts afresh
    assert a.times == b.times and a.phases == b.phases
    other = Fleet(FleetConfig(**{**SMALL.__dict__, "seed": 4}))
    assert [(f.node, f.cause, f.start) for f in other.truth] != [(f.node, f.cause, f.start) for f in a.truth]


def test_fault_free_fleet_is_the_same_fleet_without_faults(small):
    fleet, samples, _ = small
    clean = Fleet(FleetConfig(**{**SMALL.__dict__, "faults": False}))
    assert clean.truth == []
    clean_samples = _by_node(clean, 6)
    untouched = [n for n in samples if not any(f.node == n for f in fleet.truth)]
    assert untouched
    for node in untouched:  # same noise, sample for sample
        assert orjson.dumps(samples[node]) == orjson.dumps(clean_samples[node])
    for node in samples:  # and the same up to a node's first fault (less the 3 minutes kept clear of application XIDs)
        first = min((f.start for f in fleet.truth if f.node == node), default=math.inf)
        before = [s for s in samples[node] if s["ts"] < first - 180.0]
        assert before and orjson.dumps(before) == orjson.dumps(clean_samples[node][: len(before)])
    assert [t for t, _, _ in fleet.bodies(6)] == [t for t, _, _ in clean.bodies(6)]


def test_bodies_are_valid_protocol_v1(small):
    _, _, bodies = small
    for body in bodies[:: max(1, len(bodies) // 40)]:
        jsonschema.validate(body, SCHEMA)
    fleet = small[0]
    late = _spec(fleet, "appear").name
    assert {len(b["samples"]) for b in bodies if b["node"] != late} == {6}
    assert {len(b["samples"]) for b in bodies if b["node"] == late} <= set(range(1, 7))
    assert sum(len(b["samples"]) for b in bodies) == sum(SMALL.steps - k for k in fleet.first)


def _drops(series: list[dict]) -> list[tuple]:
    """(ts, entity, counter, value) of every counter that went down."""
    out, last = [], {}
    for s in series:
        for g in s["gpus"]:
            for k in GPU_COUNTERS:
                if g.get(k) is not None:
                    key = (g["uuid"], k)
                    if g[k] < last.get(key, 0):
                        out.append((s["ts"], g["index"], k, g[k]))
                    last[key] = g[k]
        for n in s["nics"]:
            for k in NIC_COUNTERS:
                key = (n["device"], k)
                if n[k] < last.get(key, 0):
                    out.append((s["ts"], n["device"], k, n[k]))
                last[key] = n[k]
    return out


def test_counters_only_go_down_at_a_reset(small):
    """Every counter only grows, except once at the GPU reset (all of the node's GPU counters
    back to zero) and once at the IB counter reset (all of that port's)."""
    fleet, samples, _ = small
    t0 = SMALL.t0
    gpu_node, ib_node = _spec(fleet, "gpu_reset"), _spec(fleet, "ib_reset")
    for node, series in samples.items():
        drops = _drops(series)
        if node == gpu_node.name:
            k = next(i for i, s in enumerate(series) if s["ts"] - t0 >= gpu_node.gpu_reset)
            assert {d[0] for d in drops} == {series[k]["ts"]}
            for g in series[k]["gpus"]:  # everything from zero (a noise event may count at once)
                assert all(g[c] <= 2 for c in GPU_COUNTERS) and g["nvlink_tx_bytes_total"] == 0
            assert all(g["pcie_replay_total"] > 2 for g in series[k - 1]["gpus"])
            # The node idles around it (the reset is a job epilog's, not a job's interruption).
            near = [s for s in series if abs(s["ts"] - series[k]["ts"]) <= 60]
            assert all(g["clocks_event_reasons"] & IDLE for s in near for g in s["gpus"])
        elif node == ib_node.name:
            device, at = ib_node.ib_reset
            reset_ts = next(s["ts"] for s in series if s["ts"] - t0 >= at)
            assert {(d[0], d[1]) for d in drops} == {(reset_ts, device)}
            assert {d[2] for d in drops} >= {"tx_bytes_total", "rx_bytes_total", "xmit_discards_total"}
        else:
            assert drops == [], node


def test_schedule_covers_every_cause_and_variant():
    fleet = Fleet(FleetConfig(nodes=32, interval=1.0, duration=3600.0, seed=1, t0=1_700_000_000.0))
    assert {f.cause for f in fleet.truth} == set(CAUSES)
    assert {(f.cause, f.variant) for f in fleet.truth} == {(v.cause, v.name) for v in VARIANTS}
    for f in fleet.truth:  # on the node's own samples
        times = fleet.times[int(f.node.rsplit("-", 1)[1])]
        k = bisect_left(times, f.start)
        assert times[k] == f.start and f.end in times and f.end > f.start
        if f.cause == "xid":
            assert f.end == times[k + 1]
    # never two faults on one node at once
    by_node = defaultdict(list)
    for f in fleet.truth:
        if "/" not in f.id or f.id.endswith("/g0"):
            by_node[f.node].append((f.start, f.end))
    for spans in by_node.values():
        spans.sort()
        assert all(b[0] >= a[1] for a, b in zip(spans, spans[1:]))


def _gpu(sample: dict, index: int) -> dict | None:
    return next((g for g in sample["gpus"] if g["index"] == index), None)


def _working(g: dict | None) -> bool:
    return g is not None and not g.get("lost") and g["util_gpu_pct"] >= 66 and not g["clocks_event_reasons"] & IDLE


def test_ground_truth_matches_the_samples(small):
    fleet, samples, _ = small
    assert len(fleet.truth) >= 12 and len({f.cause for f in fleet.truth}) >= 8
    for f in fleet.truth:
        series = samples[f.node]
        inside = [s for s in series if f.start <= s["ts"] < f.end]
        assert inside and inside[0]["ts"] == f.start, f
        before = next(s for s in reversed(series) if s["ts"] < f.start)
        if f.gpu is None:  # a port
            _check_port_fault(f, inside, before)
        else:
            _check_gpu_fault(f, inside, before)


def _check_port_fault(f: Fault, inside: list[dict], before: dict) -> None:
    ports = [next(n for n in s["nics"] if n["device"] == f.nic) for s in inside]
    prev = next(n for n in before["nics"] if n["device"] == f.nic)
    if f.variant == "port_down":
        assert all(p["state"] == "DOWN" for p in ports)
    elif f.variant == "rate_200":
        assert all(p["rate_gbps"] == 200.0 for p in ports) and ports[0]["link_downed_total"] == prev["link_downed_total"] + 1
    elif f.variant == "symbol_errors":
        seq = [prev, *ports]
        assert all(b["symbol_errors_total"] > a["symbol_errors_total"] for a, b in zip(seq, seq[1:]))
    else:
        assert all(p["state"] == "ACTIVE" and p["rate_gbps"] == 400.0 for p in ports)


def _check_gpu_fault(f: Fault, inside: list[dict], before: dict) -> None:
    gpus = [_gpu(s, f.gpu) for s in inside]
    if f.cause == "lost":
        assert all(g is None for g in gpus) if f.variant == "vanished" else all(g["lost"] for g in gpus)
        return
    check = _GPU_FAULT_CHECKS.get(f.cause)
    if check is not None:
        check(f, gpus, inside, before)


def _busy(gpus: list[dict]) -> list[dict]:
    return [g for g in gpus if _working(g)]


def _check_thermal(f: Fault, gpus: list[dict], inside: list[dict], before: dict) -> None:
    busy = _busy(gpus)
    bits = [g["clocks_event_reasons"] for g in busy]
    assert busy and all(b & SW_THERMAL and not b & SW_POWER_CAP for b in bits)
    if f.variant == "hw_thermal":
        assert all(b & HW_THERMAL and b & HW_SLOWDOWN for b in bits)


def _check_power(f: Fault, gpus: list[dict], inside: list[dict], before: dict) -> None:
    if f.variant in ("brake", "node_brake"):
        assert all(g["clocks_event_reasons"] & HW_POWER_BRAKE for g in gpus)
        assert all(g["sm_clock_mhz"] < 0.1 * g["sm_clock_max_mhz"] for g in gpus)
    else:
        bits = [g["clocks_event_reasons"] for g in _busy(gpus)]
        assert all(g["power_limit_w"] == round(f.param * 700) or g["power_limit_w"] == round(f.param * 400) for g in gpus)
        assert all(b & ~(SW_POWER_CAP | IDLE) == 0 for b in bits)  # only the routine bit


def _check_hw_slowdown(f: Fault, gpus: list[dict], inside: list[dict], before: dict) -> None:
    assert all(g["clocks_event_reasons"] & HW_SLOWDOWN for g in gpus)


def _check_clock(f: Fault, gpus: list[dict], inside: list[dict], before: dict) -> None:
    busy = _busy(gpus)
    assert busy and all(g["clocks_event_reasons"] == 0 for g in busy)  # no reason bit at all
    peers = [[p for p in s["gpus"] if p["index"] != f.gpu and _working(p)] for s in inside]
    for g, ps in zip(gpus, peers):
        if _working(g) and ps:
            median = sorted(p["sm_clock_mhz"] / p["sm_clock_max_mhz"] for p in ps)[len(ps) // 2]
            assert g["sm_clock_mhz"] / g["sm_clock_max_mhz"] < median * (f.param + 0.04)


def _check_nvlink(f: Fault, gpus: list[dict], inside: list[dict], before: dict) -> None:
    if f.variant == "links_down":
        assert all(g["nvlink_links_up"] == g["nvlink_links_total"] - 2 for g in gpus)
    elif f.variant in ("crc_rising", "replay_rising"):
        key = "nvlink_crc_errors_total" if f.variant == "crc_rising" else "nvlink_replay_errors_total"
        assert gpus[-1][key] - _gpu(before, f.gpu)[key] >= len(_busy(gpus))


def _check_pcie(f: Fault, gpus: list[dict], inside: list[dict], before: dict) -> None:
    if f.variant == "gen_down":
        assert all(g["pcie_gen"] <= g["pcie_gen_max"] - 2 for g in gpus)
    elif f.variant == "width_down":
        assert all(g["pcie_width"] == 8 for g in gpus)
    else:
        assert gpus[-1]["pcie_replay_total"] - _gpu(before, f.gpu)["pcie_replay_total"] >= len(_busy(gpus))


def _check_xid(f: Fault, gpus: list[dict], inside: list[dict], before: dict) -> None:
    assert [x["xid"] for x in gpus[0]["xids"]] == [int(f.param)]
    assert before["ts"] <= gpus[0]["xids"][0]["ts"] <= f.start  # since the node's previous sample


def _check_ecc(f: Fault, gpus: list[dict], inside: list[dict], before: dict) -> None:
    assert all(g["remapped_rows_pending"] for g in gpus)
    if f.variant == "uncorrected":
        assert gpus[0]["ecc_uncorrected_total"] == _gpu(before, f.gpu)["ecc_uncorrected_total"] + 1


# What each cause must show on its GPU (a lost GPU is checked on its own, a port's faults by _check_port_fault).
_GPU_FAULT_CHECKS = {
    "thermal": _check_thermal, "power": _check_power, "hw_slowdown": _check_hw_slowdown, "clock": _check_clock,
    "nvlink": _check_nvlink, "pcie": _check_pcie, "xid": _check_xid, "ecc": _check_ecc,
}


def test_outside_faults_only_routine_noise(small):
    """No hardware reason bit, lost GPU, down port or hardware XID outside the injected faults;
    application XIDs and isolated corrected errors do occur."""
    fleet, samples, _ = small
    dt = SMALL.interval
    for node, series in samples.items():
        faults = [f for f in fleet.truth if f.node == node]
        for s in series:
            active = [f for f in faults if f.start <= s["ts"] < f.end + 30 * dt]
            if any(f.cause == "lost" and f.variant == "vanished" for f in active):
                continue
            assert len(s["gpus"]) == 8 or active
            for g in s["gpus"]:
                if any(f.gpu in (g["index"], None) for f in active):
                    continue
                assert not g.get("lost")
                assert g["clocks_event_reasons"] & ~(IDLE | SW_POWER_CAP) == 0, (node, s["ts"], g)
                assert g["nvlink_links_up"] == g["nvlink_links_total"]
                assert not g["remapped_rows_pending"]
                for x in g["xids"]:
                    assert x["xid"] in APP_XIDS
            for n in s["nics"]:
                if not any(f.nic == n["device"] for f in active):
                    assert n["state"] == "ACTIVE" and n["rate_gbps"] == 400.0
    busy_power_cap = sum(1 for series in samples.values() for s in series for g in s["gpus"]
                         if g.get("clocks_event_reasons") == SW_POWER_CAP)
    assert busy_power_cap > 0  # the routine bit is there to be ignored


# --- sampling, counters, churn and delivery as a real fleet's -----------------------------------

HOUR = FleetConfig(nodes=24, interval=1.0, duration=3600.0, seed=1, t0=1_700_000_000.0, faults=False)


@pytest.fixture(scope="module")
def hour():
    """A fault-free hour of 24 nodes at 1 s (its layout only: tests sample the nodes they need)."""
    return Fleet(HOUR)


def _spec(fleet: Fleet, attr: str):
    """The node that got this bit of churn."""
    return next(n for n in fleet.layout.nodes if getattr(n, attr) not in (None, 0.0))


def _fine(spec, a: float, b: float, step: float = 0.01) -> dict[str, float]:
    """Seconds in each state within [a, b], read off the instantaneous state on a fine grid:
    an independent check of the generator's analytic integration."""
    out: dict[str, float] = defaultdict(float)
    n = max(1, round((b - a) / step))
    for i in range(n):
        t = a + (i + 0.5) * (b - a) / n
        out[state(spec, t, t)] += (b - a) / n
    return out


def test_each_node_samples_on_its_own_phase_with_jitter(hour):
    cfg = hour.cfg
    assert all(0.0 <= p < cfg.interval for p in hour.phases)
    assert len({round(p, 3) for p in hour.phases}) == len(hour.layout.nodes)
    late = 0
    for phase, times in zip(hour.phases, hour.times):
        assert all(b > a for a, b in zip(times, times[1:]))
        assert all(t == round(t, 3) for t in times[:50])  # milliseconds
        for k, t in enumerate(times):
            err = (t - cfg.t0 - phase) / cfg.interval - k
            assert -0.1 - 1e-6 <= err <= 0.25 + 1e-6 or (k == 0 and t == cfg.t0)
            late += err > 0.1 + 1e-6
    assert 0.002 < late / (len(hour.layout.nodes) * cfg.steps) < 0.01  # about one tick in 200 stalls
    assert hour.t_end == max(t[-1] for t in hour.times) + cfg.interval
    assert hour.cfg.t0 + cfg.duration < hour.t_end < hour.cfg.t0 + cfg.duration + 1.5 * cfg.interval


def test_sync_puts_every_node_on_one_grid_pushed_round_by_round():
    cfg = FleetConfig(**{**SMALL.__dict__, "sync": True})
    fleet = Fleet(cfg)
    assert all(times == [cfg.t0 + k * cfg.interval for k in range(cfg.steps)] for times in fleet.times)
    assert fleet.t_end == cfg.t0 + cfg.steps * cfg.interval
    rounds = [(round((body["samples"][-1]["ts"] - cfg.t0) / cfg.interval) // 6, idx) for _, idx, body in fleet.bodies(6)]
    assert rounds == sorted(rounds)  # every node's k-th batch before anyone's (k+1)-th, in node order
    assert all(f.start in fleet.times[0] for f in fleet.truth)
    assert Fleet(SMALL).layout.jobs[0].pauses == fleet.layout.jobs[0].pauses  # the same world, sampled otherwise


def _steady(fleet: Fleet, job) -> tuple:
    """A node of the job with no churn of its own, and a stretch of steady steps of it
    (offsets): from just after the job starts to just before its first pause."""
    spec = next(fleet.layout.nodes[i] for i in job.nodes
                if fleet.layout.nodes[i].member == (-math.inf, math.inf) and fleet.layout.nodes[i].appear == 0)
    return spec, job.start + 10, min(job.end, next(a for a, _, _ in job.pauses)) - 10


def test_counters_integrate_the_phases_gauges_show_the_instant(hour):
    job = max(hour.layout.jobs, key=lambda j: j.period)
    assert job.period >= 3.0
    spec, begin, end = _steady(hour, job)
    m, t0 = spec.model, hour.cfg.t0
    series = [s for s in hour.node_samples(spec.idx) if s["ts"] - t0 >= begin]
    comm_rate = m.nvlink_peak * job.nvlink_frac
    heavy, compute_only = [], []
    nvl_total = ib_total = expected_nvl = expected_ib = 0.0
    for a, b in zip(series, series[1:]):
        if b["ts"] - t0 >= end:
            break
        gap = b["ts"] - a["ts"]
        fine = _fine(spec, a["ts"] - t0, b["ts"] - t0)
        nvl = b["gpus"][0]["nvlink_tx_bytes_total"] - a["gpus"][0]["nvlink_tx_bytes_total"]
        ib = sum(b["nics"][0][k] - a["nics"][0][k] for k in ("tx_bytes_total", "rx_bytes_total"))
        if fine["comm"] >= 0.5 * gap:
            heavy.append(nvl / gap)
        elif fine["compute"] >= gap - 1e-9:
            compute_only.append(nvl / gap)
        nvl_total += nvl
        ib_total += ib
        expected_nvl += comm_rate * (fine["comm"] + job.nvlink_compute * fine["compute"])
        expected_ib += job.ib_bps * spec.ib_share * (fine["comm"] + job.ib_compute * fine["compute"])  # a pipeline end: its share
        # Gauges are what the GPU does at the sample's instant.
        st = state(spec, b["ts"] - t0, a["ts"] - t0)
        util = b["gpus"][0]["util_gpu_pct"]
        assert util >= 98 if st == "compute" else util <= 96
    assert len(heavy) > 10 and len(compute_only) > 100
    assert min(heavy) > max(compute_only)
    assert sum(heavy) / len(heavy) > 2 * sum(compute_only) / len(compute_only)
    assert nvl_total == pytest.approx(expected_nvl, rel=0.01)
    assert ib_total == pytest.approx(expected_ib, rel=0.01)


def test_a_long_sample_averages_over_short_steps():
    """At 5 s over 1-3 s steps a sample carries whole steps: its NVLink rate is the step's
    average, not one phase's."""
    fleet = Fleet(FleetConfig(**{**HOUR.__dict__, "interval": 5.0}))
    job = min(fleet.layout.jobs, key=lambda j: j.period)
    assert job.period <= 3.0
    spec, begin, end = _steady(fleet, job)
    series = [s for s in fleet.node_samples(spec.idx) if begin <= s["ts"] - fleet.cfg.t0 < end]
    rates = [(b["gpus"][0]["nvlink_tx_bytes_total"] - a["gpus"][0]["nvlink_tx_bytes_total"]) / (b["ts"] - a["ts"])
             for a, b in zip(series, series[1:])]
    comm = spec.model.nvlink_peak * job.nvlink_frac
    mean = comm * (job.comm_frac + job.nvlink_compute * (1 - job.comm_frac))
    assert all(abs(r / mean - 1) < 0.35 for r in rates)  # a phase alone would be x0.3-0.5 or x2-4
    assert sum(rates) / len(rates) == pytest.approx(mean, rel=0.03)


def test_pauses_are_the_whole_jobs_at_once(hour):
    """Every node of a job pauses at the same instants: checkpoints idle, evaluations busy
    below the cap with a little NVLink and next to no InfiniBand."""
    t0 = hour.cfg.t0
    job = max(hour.layout.jobs, key=lambda j: len(j.evals))
    assert job.evals and job.checkpoints
    for i in job.nodes:
        spec = hour.layout.nodes[i]
        series = hour.node_samples(i)
        seen = set()
        for a, b in zip(series, series[1:]):
            off, poff = b["ts"] - t0, a["ts"] - t0
            if not spec.span[0] <= poff < off < spec.span[1]:
                continue
            for p0, p1, kind in job.pauses:
                if p0 <= poff and off < p1:
                    seen.add(kind)
                    gpus, nic = b["gpus"], b["nics"][0]
                    ib = (nic["tx_bytes_total"] + nic["rx_bytes_total"] - a["nics"][0]["tx_bytes_total"]
                          - a["nics"][0]["rx_bytes_total"]) / (off - poff)
                    # Counters a driver refreshes (cached.py) do not cover the interval.
                    counted = spec.cached_counters is None
                    if kind == "ckpt":
                        assert all(g["clocks_event_reasons"] == IDLE and g["util_gpu_pct"] == 0 for g in gpus)
                    else:
                        assert all(60 <= g["util_gpu_pct"] <= 90 and g["clocks_event_reasons"] == 0 for g in gpus)
                        nvl = (gpus[0]["nvlink_tx_bytes_total"] - a["gpus"][0]["nvlink_tx_bytes_total"]) / (off - poff)
                        assert not counted or 0 < nvl < 0.15 * spec.model.nvlink_peak * job.nvlink_frac
                    assert not counted or ib < 0.03 * job.ib_bps
        assert seen == {"ckpt", "eval"} or spec.span[0] > 0, spec.name


def test_a_job_resizes_and_its_labels_follow(hour):
    spec = next(n for n in hour.layout.nodes if n.member != (-math.inf, math.inf))
    lo, hi = spec.span
    t0 = hour.cfg.t0
    moment = spec.member[0] if spec.member[0] > -math.inf else spec.member[1]  # joins, or leaves
    assert 0.4 * HOUR.duration <= moment <= 0.65 * HOUR.duration
    labelled = [(body["samples"][0]["ts"] - t0, "job" in body["labels"]) for _, _, body in hour.bodies(30, [spec.idx])]
    assert any(has for _, has in labelled) and not all(has for _, has in labelled)
    assert all(has == (lo <= off < hi) for off, has in labelled)
    series = hour.node_samples(spec.idx)
    working = [s["ts"] - t0 for s in series if s["gpus"][0]["util_gpu_pct"] >= 66]
    assert working and all(lo <= off < hi for off in working)


def test_one_job_mixes_gpu_models(hour):
    mixed = [j for j in hour.layout.jobs if len({hour.layout.nodes[i].model.key for i in j.nodes}) > 1]
    assert len(mixed) == 1


def test_a_node_joins_the_fleet_mid_run(hour):
    spec = _spec(hour, "appear")
    t0 = hour.cfg.t0
    assert 0.15 * HOUR.duration <= spec.appear <= 0.25 * HOUR.duration
    first = next(iter(hour.bodies(30, [spec.idx])))[2]["samples"][0]["ts"]
    assert t0 + spec.appear <= first < t0 + spec.appear + 1.3 * HOUR.interval
    assert first == hour.times[spec.idx][hour.first[spec.idx]]
    assert all(times[hour.first[i]] < t0 + HOUR.interval for i, times in enumerate(hour.times) if i != spec.idx)


def test_pushes_arrive_in_send_order_and_the_outage_replays_its_spool():
    fleet = Fleet(FleetConfig(**{**SMALL.__dict__, "interval": 1.0}))
    t0 = fleet.cfg.t0
    out = _spec(fleet, "outage")
    a, b = (t0 + x for x in out.outage)
    assert 300 <= b - a <= 600 or b - a == pytest.approx(0.2 * SMALL.duration, abs=0.2)
    sent = list(fleet.bodies(30))
    assert [t for t, _, _ in sent] == sorted(t for t, _, _ in sent)
    by_node: dict[int, list] = defaultdict(list)
    for t, idx, body in sent:
        by_node[idx].append((t, body))
    for idx, items in by_node.items():
        ts = [s["ts"] for _, body in items for s in body["samples"]]
        assert ts == sorted(ts) and len(set(ts)) == len(ts)  # each node's own bodies in its own time order
        delays = [t - body["samples"][-1]["ts"] for t, body in items]
        assert all(d >= 0 for d in delays)
        if idx != out.idx:
            assert all(d <= 2.25 for d in delays)
            continue
        spooled = [(t, body) for t, body in items if a <= body["samples"][-1]["ts"] + 2.0 and body["samples"][-1]["ts"] < b]
        assert len(spooled) >= (b - a) / 30 - 1
        assert all(t >= b for t, _ in spooled)  # nothing gets through during the outage
        assert max(delays) >= b - a - 32  # the oldest spooled batch waited the whole outage
        assert spooled[-1][0] < b + 2.0 + 0.2 * len(spooled)  # replayed right after it, oldest first
        # Its samples during the outage were still taken, one interval apart.
        inside = [s["ts"] for _, body in items for s in body["samples"] if a <= s["ts"] < b]
        assert len(inside) >= (b - a) / fleet.cfg.interval - 2


def test_faults_keep_clear_of_pauses_resets_outages_and_late_nodes():
    fleet = Fleet(FleetConfig(nodes=24, interval=1.0, duration=3600.0, seed=1, t0=1_700_000_000.0))
    t0, gap = fleet.cfg.t0, 150.0
    nodes = {n.name: n for n in fleet.layout.nodes}
    quiet_nodes = {n.name for n in fleet.layout.nodes if n.quiet()}
    assert quiet_nodes and len(fleet.truth) >= 60
    for f in fleet.truth:
        spec = nodes[f.node]
        start, end = f.start - t0, f.end - t0
        assert start >= spec.appear + 240
        assert not any(a - gap < end and start < b + gap for a, b in spec.quiet())
        if spec.job is not None:
            assert spec.span[0] + 120 <= start and end <= spec.span[1] - 30
            assert not spec.in_pause(start, 3 * fleet.cfg.interval)
            # At most ceil(n/2) of a job's nodes faulty at once.
            faulty = {g.node for g in fleet.truth if nodes[g.node].job is spec.job and g.start <= f.start < g.end}
            assert len(faulty) <= max(1, (len(spec.job.nodes) + 1) // 2)


def test_time_to_detect_counts_the_nodes_own_samples():
    """With jitter a node's next sample may come a little less than an interval after the
    fault's start: the scorer counts the node's samples, given their times."""
    fleet = Fleet(FleetConfig(**{**HOUR.__dict__, "faults": True}))
    times = {n.name: fleet.times[n.idx] for n in fleet.layout.nodes}
    early = []
    for f in fleet.truth:
        series = times[f.node]
        k = bisect_left(series, f.start)
        if series[k + 1] - f.start < fleet.cfg.interval:
            early.append((f, series[k + 1]))
    assert early
    for f, second in early[:5]:
        episode = {"id": f.id, "cluster": f.cluster, "node": f.node, "gpu": f.gpu, "cause": f.cause,
                   "onset": f.start, "detected_at": second, "evidence": {"device": f.nic} if f.nic else {}}
        sc = score([f], [episode], interval=fleet.cfg.interval, grace=120.0, times=times)
        assert sc["overall"]["ttd"] == [2]


@pytest.mark.parametrize("gpus", [1, 2, 4])
def test_nodes_of_fewer_gpus_report_them_and_faults_stay_on_them(gpus):
    fleet = Fleet(FleetConfig(**{**SMALL.__dict__, "gpus_per_node": gpus}))
    counts = {len(sample["gpus"]) for _, body in fleet.batches(6) for sample in body["samples"]}
    assert max(counts) == gpus and min(counts) >= gpus - 1  # one fewer: a GPU lost (a fault)
    assert fleet.truth and all(f.gpu is None or 0 <= f.gpu < gpus for f in fleet.truth)
    node_wide = defaultdict(set)
    for f in fleet.truth:
        if f.variant == "node_brake":
            node_wide[f.id.split("/")[0]].add(f.gpu)
    assert all(found == set(range(gpus)) for found in node_wide.values())


def test_serving_nodes_stand_beside_the_training_fleet_which_they_leave_unchanged():
    fleet = Fleet(FleetConfig(**{**SMALL.__dict__, "nodes": 16}))
    without = Fleet(FleetConfig(**{**SMALL.__dict__, "nodes": 16, "serving": False}))
    serving = [n for n in fleet.layout.nodes if n.serving is not None]
    assert [n.idx for n in serving] == [16, 17] and len(without.layout.nodes) == 16
    # One labelled with a job of its own, one with its partition only; never in a training job.
    labels = [n.labels(600.0) for n in serving]
    assert labels[0].get("job") == "serve-a" and "job" not in labels[1]
    assert all(n.job is None for n in serving)
    # The training nodes, their samples and the faults injected into them are the same.
    assert fleet.truth == without.truth and not {f.node for f in fleet.truth} & {n.name for n in serving}
    assert fleet.node_samples(3) == without.node_samples(3)
    assert Fleet(FleetConfig(**{**SMALL.__dict__, "nodes": 7})).layout.nodes[-1].serving is None  # none below 8 nodes


def test_a_serving_nodes_gpus_each_do_their_own_work():
    fleet = Fleet(FleetConfig(**{**SMALL.__dict__, "nodes": 8, "faults": False}))
    node = next(n for n in fleet.layout.nodes if n.serving is not None)
    samples = fleet.node_samples(node.idx)
    util_spread = [max(u) - min(u) for s in samples if len(u := [g["util_gpu_pct"] for g in s["gpus"] if g["util_gpu_pct"] >= 10]) >= 3]
    assert sorted(util_spread)[len(util_spread) // 2] >= 30  # the median instant: busy GPUs 30+ points apart
    mem = {g["mem_used_bytes"] for g in samples[0]["gpus"]}
    assert len(mem) == len(samples[0]["gpus"])  # each its own model and cache
    # NVLink counters move for the GPUs of multi-GPU replicas only.
    moved = [samples[-1]["gpus"][i]["nvlink_tx_bytes_total"] - samples[0]["gpus"][i]["nvlink_tx_bytes_total"] for i in range(8)]
    replica_of = node.serving.replica_of
    assert 1 < len(set(replica_of)) < 8  # this seed: replicas of 4, 2, 1 and 1 GPUs
    assert all((m > 0) == (replica_of.count(replica_of[i]) > 1) for i, m in enumerate(moved))
    for sample in samples:
        for g in sample["gpus"]:
            capped = bool(g["clocks_event_reasons"] & SW_POWER_CAP)
            assert not capped or g["power_w"] >= 0.97 * g["power_limit_w"]  # on the cap: drawing at it
            assert capped or g["util_gpu_pct"] < 10 or g["sm_clock_mhz"] >= g["sm_clock_max_mhz"] - 15
            idle = bool(g["clocks_event_reasons"] & IDLE)
            assert idle == (g["util_gpu_pct"] < 10)
