"""Stored sample rows → observations: raw readings plus per-second rates from counter deltas
against the same GPU's or port's previous sample.

This runs for every GPU and port at every instant (half the detector's CPU once): the deltas of
a row are taken in one pass over its counters, not one call per counter."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from server.detect.model import GpuObs, NicObs

# A decrease means the counter was reset (driver reload, reboot): no rate across it.
_GPU_COUNTERS = (
    "nvlink_tx_bytes_total", "nvlink_rx_bytes_total", "nvlink_crc_errors_total", "nvlink_replay_errors_total",
    "nvlink_recovery_errors_total", "pcie_replay_total", "ecc_uncorrected_total",
)
_NIC_COUNTERS = ("tx_bytes_total", "rx_bytes_total", "symbol_errors_total", "rcv_errors_total", "link_downed_total", "xmit_wait_total")
# The stored GPU readings an observation is made of: all the detector reads back (not every
# protocol column: the dashboard-only ones, energy or encoder utilisation, cost it a read each).
GPU_READINGS = (
    "lost", "util_gpu_pct", "sm_clock_mhz", "sm_clock_max_mhz", "temp_c", "power_w", "power_limit_w", "clocks_event_reasons",
    "pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max", "nvlink_links_up", "nvlink_links_total", "remapped_rows_pending",
    *_GPU_COUNTERS,
)


def _deltas(now: Mapping[str, Any], prev: Mapping[str, Any] | None, keys: tuple[str, ...]) -> list[int | None]:
    """now - prev of each counter; None without a previous sample, a reading, or across a reset."""
    if prev is None:
        return [None] * len(keys)
    return [None if a is None or b is None or b < a else b - a for a, b in zip(map(prev.get, keys), map(now.get, keys))]


def _per_s(delta: int | None, dt: float) -> float | None:
    return None if delta is None or dt <= 0 else delta / dt


def gpu_obs(row: Mapping[str, Any], prev: Mapping[str, Any] | None, *, group: str, xids: tuple[int, ...] = ()) -> GpuObs:
    dt = row["ts"] - prev["ts"] if prev is not None else 0.0
    tx, rx, crc, replay, recovery, pcie, ecc = _deltas(row, prev, _GPU_COUNTERS)
    return GpuObs(
        ts=row["ts"], cluster=row["cluster"], node=row["node"], uuid=row["uuid"], index=row["index"], model=row["model"], group=group,
        lost=bool(row["lost"]), util_gpu_pct=row["util_gpu_pct"], sm_clock_mhz=row["sm_clock_mhz"],
        sm_clock_max_mhz=row["sm_clock_max_mhz"], temp_c=row["temp_c"], power_w=row["power_w"], power_limit_w=row["power_limit_w"],
        reasons=row["clocks_event_reasons"], pcie_gen=row["pcie_gen"], pcie_gen_max=row["pcie_gen_max"], pcie_width=row["pcie_width"],
        pcie_width_max=row["pcie_width_max"], nvlink_links_up=row["nvlink_links_up"], nvlink_links_total=row["nvlink_links_total"],
        ecc_uncorrected_total=row["ecc_uncorrected_total"], remapped_rows_pending=row["remapped_rows_pending"], xids=xids,
        workload=row.get("workload_label"), job=row.get("workload_job"),
        nvlink_bps=None if tx is None or rx is None or dt <= 0 else (tx + rx) / dt,
        nvlink_crc_per_s=_per_s(crc, dt), nvlink_replay_per_s=_per_s(replay, dt), nvlink_recovery_per_s=_per_s(recovery, dt),
        pcie_replay_per_s=_per_s(pcie, dt), ecc_uncorrected_new=ecc,
    )


def nic_obs(row: Mapping[str, Any], prev: Mapping[str, Any] | None, *, group: str, node_busy: bool) -> NicObs:
    dt = row["ts"] - prev["ts"] if prev is not None else 0.0
    tx, rx, symbol, rcv, downed, wait = _deltas(row, prev, _NIC_COUNTERS)
    return NicObs(
        ts=row["ts"], cluster=row["cluster"], node=row["node"], device=row["device"], port=row["port"], group=group,
        state=row["state"], rate_gbps=row["rate_gbps"], bps=None if tx is None or rx is None or dt <= 0 else (tx + rx) / dt,
        symbol_errors_per_s=_per_s(symbol, dt), rcv_errors_per_s=_per_s(rcv, dt), link_downed_new=downed,
        xmit_wait_per_s=_per_s(wait, dt), node_busy=node_busy,
    )
