"""Request bodies for protocol tests, built the way an agent builds them."""

from __future__ import annotations

import gzip
import json
import time
from typing import Any


def gpu(index: int = 0, *, node: str = "gpu-node-001", **metrics: Any) -> dict[str, Any]:
    base = {
        "index": index,
        "uuid": f"GPU-{node}-{index:04d}",
        "model": "NVIDIA H100 80GB HBM3",
        "pci_bus_id": f"00000000:{index + 0x18:02X}:00.0",
        "temp_c": 61.0,
        "power_w": 650.5,
        "power_limit_w": 700.0,
        "sm_clock_mhz": 1980,
        "sm_clock_max_mhz": 1980,
        "util_gpu_pct": 99.0,
        "clocks_event_reasons": 4,
        "nvlink_tx_bytes_total": 123456789012,
        "xids": [],
    }
    return base | metrics


def nic(device: str = "mlx5_0", port: int = 1, **metrics: Any) -> dict[str, Any]:
    return {"device": device, "port": port, "state": "ACTIVE", "rate_gbps": 400.0, "tx_bytes_total": 4096} | metrics


def batch(*, node: str = "gpu-node-001", cluster: str = "prod-a", samples: int = 1, gpus: int = 2, ts: float | None = None,
          **extra: Any) -> dict[str, Any]:
    start = time.time() - 60 if ts is None else ts
    return {
        "version": 1,
        "node": node,
        "cluster": cluster,
        "labels": {"job": "llm-a", "rack": "r12"},
        "agent": {"version": "0.1.0", "driver": "550.54.15", "cuda": "12.4"},
        "samples": [
            {"ts": start + i, "gpus": [gpu(g, node=f"{cluster}.{node}") for g in range(gpus)], "nics": [nic()]} for i in range(samples)
        ],
    } | extra


def encode(body: Any, *, gzipped: bool = False) -> tuple[bytes, dict[str, str]]:
    raw = json.dumps(body).encode() if not isinstance(body, bytes) else body
    headers = {"content-type": "application/json"}
    if gzipped:
        return gzip.compress(raw), headers | {"content-encoding": "gzip"}
    return raw, headers
