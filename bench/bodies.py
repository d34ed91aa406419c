"""Pre-encoded v1 request bodies for a simulated fleet, shared by the ingest benchmarks."""

from __future__ import annotations

import gzip
import json
import random


def gpu_record(rng: random.Random, node: int, index: int, step: int) -> dict:
    busy = rng.random() > 0.05
    return {
        "index": index,
        "uuid": f"GPU-{node:05d}-{index:02d}-bench",
        "model": "NVIDIA H100 80GB HBM3",
        "pci_bus_id": f"00000000:{0x18 + index:02X}:00.0",
        "temp_c": round(rng.gauss(66 if busy else 35, 3), 1),
        "mem_temp_c": round(rng.gauss(72 if busy else 38, 3), 1),
        "power_w": round(max(0.0, rng.gauss(650 if busy else 70, 20)), 2),
        "power_limit_w": 700.0,
        "sm_clock_mhz": int(rng.gauss(1900, 40)) if busy else 345,
        "sm_clock_max_mhz": 1980,
        "mem_clock_mhz": 2619,
        "mem_clock_max_mhz": 2619,
        "util_gpu_pct": float(rng.randint(95, 100)) if busy else 0.0,
        "util_mem_pct": float(rng.randint(30, 60)) if busy else 0.0,
        "mem_used_bytes": 71_000_000_000,
        "mem_total_bytes": 85_520_809_984,
        "clocks_event_reasons": 4 if busy else 1,
        "pcie_gen": 5,
        "pcie_gen_max": 5,
        "pcie_width": 16,
        "pcie_width_max": 16,
        "pcie_replay_total": 0,
        "pcie_tx_bytes_per_s": round(rng.uniform(1e8, 2e9), 1),
        "pcie_rx_bytes_per_s": round(rng.uniform(1e8, 2e9), 1),
        "nvlink_links_up": 18,
        "nvlink_links_total": 18,
        "nvlink_tx_bytes_total": 10**12 + step * 10**10,
        "nvlink_rx_bytes_total": 10**12 + step * 10**10,
        "nvlink_crc_errors_total": 0,
        "nvlink_replay_errors_total": 0,
        "nvlink_recovery_errors_total": 0,
        "ecc_corrected_total": 0,
        "ecc_uncorrected_total": 0,
        "remapped_rows_pending": False,
        "tensor_active_pct": round(rng.uniform(40.0, 70.0), 1) if busy else 0.0,  # GPM, as a Hopper agent sends it
        "xids": [],
    }


def nic_record(rng: random.Random, device: int, step: int) -> dict:
    return {
        "device": f"mlx5_{device}",
        "port": 1,
        "state": "ACTIVE",
        "rate_gbps": 400.0,
        "tx_bytes_total": 10**12 + step * rng.randint(10**9, 10**10),
        "rx_bytes_total": 10**12 + step * rng.randint(10**9, 10**10),
        "symbol_errors_total": 0,
        "link_downed_total": 0,
        "rcv_errors_total": 0,
        "xmit_discards_total": 0,
        "xmit_wait_total": step * 1000,
    }


def fleet_bodies(*, nodes: int, requests_per_node: int, samples_per_request: int, gpus: int = 8, nics: int = 8,
                 t0: float, interval: float = 1.0, seed: int = 7) -> list[bytes]:
    """Gzipped bodies, in the order a fleet would send them (round-robin over nodes)."""
    rng = random.Random(seed)
    bodies = []
    for r in range(requests_per_node):
        for node in range(nodes):
            samples = []
            for s in range(samples_per_request):
                step = r * samples_per_request + s
                samples.append({
                    "ts": t0 + step * interval,
                    "gpus": [gpu_record(rng, node, i, step) for i in range(gpus)],
                    "nics": [nic_record(rng, i, step) for i in range(nics)],
                })
            body = {"version": 1, "node": f"node-{node:05d}", "cluster": "bench", "labels": {"job": "bench"},
                    "agent": {"version": "bench", "driver": "550.54.15", "cuda": "12.4"}, "samples": samples}
            bodies.append(gzip.compress(json.dumps(body).encode(), compresslevel=6))
    return bodies
