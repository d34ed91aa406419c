"""The fleet generator (bench/fleetgen): deterministic by seed, valid protocol v1, and its
ground truth is what the samples show."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import jsonschema
import orjson
import pytest

from bench.fleetgen import CAUSES, VARIANTS, Fleet, FleetConfig
from bench.fleetgen.models import HW_POWER_BRAKE, HW_SLOWDOWN, HW_THERMAL, IDLE, SW_POWER_CAP, SW_THERMAL
from bench.fleetgen.sim import APP_XIDS

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "docs" / "protocol.schema.json").read_text())
SMALL = FleetConfig(nodes=8, interval=5.0, duration=1800.0, seed=3, t0=1_700_000_000.0, faults_per_cause=3)
GPU_COUNTERS = ("pcie_replay_total", "nvlink_tx_bytes_total", "nvlink_rx_bytes_total", "nvlink_crc_errors_total",
                "nvlink_replay_errors_total", "nvlink_recovery_errors_total", "ecc_corrected_total", "ecc_uncorrected_total")
NIC_COUNTERS = ("tx_bytes_total", "rx_bytes_total", "symbol_errors_total", "link_downed_total", "rcv_errors_total",
                "xmit_discards_total", "xmit_wait_total")


def _bodies(cfg: FleetConfig, batch: int = 6) -> list[dict]:
    return [body for _, body in Fleet(cfg).batches(batch)]


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
    first_a = [orjson.dumps(body) for _, body in a.batches(6)][:40]
    first_b = [orjson.dumps(body) for _, body in b.batches(6)][:40]
    assert first_a == first_b
    other = Fleet(FleetConfig(**{**SMALL.__dict__, "seed": 4}))
    assert [(f.node, f.cause, f.start) for f in other.truth] != [(f.node, f.cause, f.start) for f in a.truth]


def test_fault_free_fleet_is_the_same_fleet_without_faults(small):
    fleet, samples, _ = small
    clean = Fleet(FleetConfig(**{**SMALL.__dict__, "faults": False}))
    assert clean.truth == []
    clean_samples: dict[str, list[dict]] = defaultdict(list)
    for _, body in clean.batches(6):
        clean_samples[body["node"]].extend(body["samples"])
    untouched = [n for n in samples if not any(f.node == n for f in fleet.truth)]
    assert untouched
    for node in untouched:  # same noise, sample for sample
        assert orjson.dumps(samples[node]) == orjson.dumps(clean_samples[node])


def test_bodies_are_valid_protocol_v1(small):
    _, _, bodies = small
    for body in bodies[:: max(1, len(bodies) // 40)]:
        jsonschema.validate(body, SCHEMA)
    assert {len(b["samples"]) for b in bodies} == {6}
    assert all(s["ts"] == SMALL.t0 + i * SMALL.interval for node in small[1].values() for i, s in enumerate(node))


def test_counters_never_decrease(small):
    _, samples, _ = small
    for node, series in samples.items():
        last: dict[tuple, int] = {}
        for s in series:
            for g in s["gpus"]:
                for k in GPU_COUNTERS:
                    if g.get(k) is not None:
                        key = (g["uuid"], k)
                        assert g[k] >= last.get(key, 0), (node, key)
                        last[key] = g[k]
            for n in s["nics"]:
                for k in NIC_COUNTERS:
                    key = (n["device"], k)
                    assert n[k] >= last.get(key, 0), (node, key)
                    last[key] = n[k]


def test_schedule_covers_every_cause_and_variant():
    fleet = Fleet(FleetConfig(nodes=32, interval=1.0, duration=3600.0, seed=1, t0=1_700_000_000.0))
    assert {f.cause for f in fleet.truth} == set(CAUSES)
    assert {(f.cause, f.variant) for f in fleet.truth} == {(v.cause, v.name) for v in VARIANTS}
    assert all(f.start % 1.0 == 0 and f.end > f.start for f in fleet.truth)
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
    dt = SMALL.interval
    for f in fleet.truth:
        series = samples[f.node]
        inside = [s for s in series if f.start <= s["ts"] < f.end]
        assert inside and inside[0]["ts"] == f.start, f
        before = next(s for s in reversed(series) if s["ts"] < f.start)
        if f.gpu is None:  # a port
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
            continue
        gpus = [_gpu(s, f.gpu) for s in inside]
        if f.cause == "lost":
            assert all(g is None for g in gpus) if f.variant == "vanished" else all(g["lost"] for g in gpus)
            continue
        busy = [g for g in gpus if _working(g)]
        bits = [g["clocks_event_reasons"] for g in busy]
        if f.cause == "thermal":
            assert busy and all(b & SW_THERMAL and not b & SW_POWER_CAP for b in bits)
            if f.variant == "hw_thermal":
                assert all(b & HW_THERMAL and b & HW_SLOWDOWN for b in bits)
        elif f.cause == "power" and f.variant in ("brake", "node_brake"):
            assert all(g["clocks_event_reasons"] & HW_POWER_BRAKE for g in gpus)
            assert all(g["sm_clock_mhz"] < 0.1 * g["sm_clock_max_mhz"] for g in gpus)
        elif f.cause == "power":
            assert all(g["power_limit_w"] == round(f.param * 700) or g["power_limit_w"] == round(f.param * 400) for g in gpus)
            assert all(b & ~(SW_POWER_CAP | IDLE) == 0 for b in bits)  # only the routine bit
        elif f.cause == "hw_slowdown":
            assert all(g["clocks_event_reasons"] & HW_SLOWDOWN for g in gpus)
        elif f.cause == "clock":
            assert busy and all(b == 0 for b in bits)  # no reason bit at all
            peers = [[p for p in s["gpus"] if p["index"] != f.gpu and _working(p)] for s in inside]
            for g, ps in zip(gpus, peers):
                if _working(g) and ps:
                    median = sorted(p["sm_clock_mhz"] / p["sm_clock_max_mhz"] for p in ps)[len(ps) // 2]
                    assert g["sm_clock_mhz"] / g["sm_clock_max_mhz"] < median * (f.param + 0.04)
        elif f.cause == "nvlink" and f.variant == "links_down":
            assert all(g["nvlink_links_up"] == g["nvlink_links_total"] - 2 for g in gpus)
        elif f.cause == "nvlink" and f.variant in ("crc_rising", "replay_rising"):
            key = "nvlink_crc_errors_total" if f.variant == "crc_rising" else "nvlink_replay_errors_total"
            assert gpus[-1][key] - _gpu(before, f.gpu)[key] >= len(busy)
        elif f.cause == "pcie" and f.variant == "gen_down":
            assert all(g["pcie_gen"] <= g["pcie_gen_max"] - 2 for g in gpus)
        elif f.cause == "pcie" and f.variant == "width_down":
            assert all(g["pcie_width"] == 8 for g in gpus)
        elif f.cause == "pcie":
            assert gpus[-1]["pcie_replay_total"] - _gpu(before, f.gpu)["pcie_replay_total"] >= len(busy)
        elif f.cause == "xid":
            assert [x["xid"] for x in gpus[0]["xids"]] == [int(f.param)]
            assert f.start - dt < gpus[0]["xids"][0]["ts"] <= f.start
        elif f.cause == "ecc":
            assert all(g["remapped_rows_pending"] for g in gpus)
            if f.variant == "uncorrected":
                assert gpus[0]["ecc_uncorrected_total"] == _gpu(before, f.gpu)["ecc_uncorrected_total"] + 1


def test_outside_faults_only_routine_noise(small):
    """No hardware reason bit, lost GPU, down port or hardware XID outside the injected faults;
    application XIDs and isolated corrected errors do occur."""
    fleet, samples, _ = small
    dt = SMALL.interval
    app_xids = 0
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
                    app_xids += 1
            for n in s["nics"]:
                if not any(f.nic == n["device"] for f in active):
                    assert n["state"] == "ACTIVE" and n["rate_gbps"] == 400.0
    busy_power_cap = sum(1 for series in samples.values() for s in series for g in s["gpus"]
                         if g.get("clocks_event_reasons") == SW_POWER_CAP)
    assert busy_power_cap > 0  # the routine bit is there to be ignored
