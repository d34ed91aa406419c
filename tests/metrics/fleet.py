"""Request bodies of a small fleet at recent sample times, pushed over real HTTP."""

from __future__ import annotations

import httpx

from tests.server.payloads import encode

HOT = 0x40  # HW thermal slowdown
GIB = 1024 ** 3


def gpu(node: str, index: int, ts: float, t0: float, *, hot: bool = False, xids: list[dict] | None = None) -> dict:
    return {
        "index": index, "uuid": f"GPU-{node}-{index}", "model": "NVIDIA H100 80GB HBM3", "pci_bus_id": f"00000000:{0x18 + index:02X}:00.0",
        "temp_c": 91.0 if hot else 60.0 + index, "mem_temp_c": 70.0 + index, "power_w": 600.0, "power_limit_w": 700.0,
        "sm_clock_mhz": 1400 if hot else 1980 - index, "sm_clock_max_mhz": 1980, "mem_clock_mhz": 2619, "mem_clock_max_mhz": 2619,
        "util_gpu_pct": 99.0, "util_mem_pct": 40.0, "mem_used_bytes": 60 * GIB, "mem_total_bytes": 80 * GIB,
        "clocks_event_reasons": HOT if hot else 0x4, "pcie_gen": 5, "pcie_gen_max": 5, "pcie_width": 16, "pcie_width_max": 16,
        "pcie_replay_total": 3, "pcie_tx_bytes_per_s": 1e9, "pcie_rx_bytes_per_s": 2e9, "nvlink_links_up": 18, "nvlink_links_total": 18,
        "nvlink_tx_bytes_total": int((ts - t0 + 1) * 5e10), "nvlink_rx_bytes_total": int((ts - t0 + 1) * 5e10),
        "nvlink_crc_errors_total": 1, "nvlink_replay_errors_total": 2, "nvlink_recovery_errors_total": 0,
        "ecc_corrected_total": 5, "ecc_uncorrected_total": 0, "remapped_rows_pending": False, "xids": xids or [],
        # GPM tensor activity; GPU 7 reports none (as an A100, or an agent's first cycle would).
        "tensor_active_pct": None if index == 7 else (25.0 if hot else 50.0 + index),
        # dcgm-exporter's default series (issue #16): an energy counter at 600 W, idle video
        # engines, 512 MiB reserved (part of mem_used_bytes), row remap counts, and GPM (not on GPU 7).
        "energy_mj_total": int(1e9 + (ts - t0) * 600_000), "util_enc_pct": 0.0, "util_dec_pct": 5.0,
        "mem_reserved_bytes": 512 * 2**20, "remapped_rows_correctable_total": index, "remapped_rows_uncorrectable_total": 0,
        "remapped_rows_failure": False,
        "gr_engine_active_pct": None if index == 7 else (60.0 if hot else 97.0),
        "dram_active_pct": None if index == 7 else (20.0 if hot else 40.0 + index),
    }


def body(node: str, ts: float, t0: float, *, cluster: str = "prod", hot_gpus: tuple[int, ...] = (), xid_gpu: int | None = None,
         gpus: int = 8) -> dict:
    nic = {"device": "mlx5_0", "port": 1, "state": "ACTIVE", "rate_gbps": 400.0, "tx_bytes_total": int((ts - t0) * 1e9),
           "rx_bytes_total": int((ts - t0) * 1e9), "symbol_errors_total": 0, "link_downed_total": 0, "rcv_errors_total": 0,
           "xmit_discards_total": 0, "xmit_wait_total": 10}
    return {
        "version": 1, "node": node, "cluster": cluster, "labels": {"job": "llm"},
        "agent": {"version": "0.1.0", "driver": "550.54.15", "cuda": "12.4"},
        "samples": [{"ts": ts, "gpus": [gpu(node, i, ts, t0, hot=i in hot_gpus,
                                            xids=[{"xid": 79, "ts": ts}] if i == xid_gpu else None) for i in range(gpus)],
                     "nics": [nic]}],
    }


def push(url: str, payload: dict) -> None:
    content, headers = encode(payload, gzipped=True)
    r = httpx.post(f"{url}/api/v1/samples", content=content, headers=headers, timeout=30)
    assert r.status_code == 200, r.text


def push_range(url: str, t0: float, start: int, stop: int, *, nodes=("n1", "n2"), hot: dict[str, tuple[int, ...]] | None = None,
               xid: dict[str, int] | None = None, cluster: str = "prod") -> None:
    """Instants t0+start .. t0+stop-1 for every node; hot: node → hot GPU indexes."""
    hot, xid = hot or {}, xid or {}
    for k in range(start, stop):
        for node in nodes:
            push(url, body(node, t0 + k, t0, cluster=cluster, hot_gpus=hot.get(node, ()), xid_gpu=xid.get(node) if k == start else None))
