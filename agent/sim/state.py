"""What a simulated GPU reads right now, and its counters: the data faults act on (agent/sim/faults.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class GpuState:
    """Instantaneous readings (what the getters answer) and the rates counters grow at."""

    busy: bool
    temp_c: float
    mem_temp_c: float | None
    power_w: float
    power_limit_w: float
    sm_clock_mhz: float
    mem_clock_mhz: int
    util_gpu: int
    util_mem: int
    mem_used_bytes: int
    reasons: int
    pcie_gen: int
    pcie_width: int
    pcie_tx_bps: float
    pcie_rx_bps: float
    links_up: list[bool]
    nvlink_link_bps: float  # per active link, per direction
    pcie_replay_rate: float = 0.0
    nvlink_crc_flit_rate: float = 0.0
    nvlink_crc_data_rate: float = 0.0
    nvlink_replay_rate: float = 0.0
    nvlink_recovery_rate: float = 0.0
    ecc_corrected_rate: float = 0.0
    ecc_uncorrected_rate: float = 0.0
    tensor_active_pct: float = 0.0  # % of cycles the tensor pipes are busy (what GPM measures)
    gr_engine_active_pct: float = 0.0  # % of time the graphics/compute engine has work (GPM)
    dram_active_pct: float = 0.0  # % of the peak DRAM bandwidth in use (GPM)

    @property
    def links_active(self) -> int:
        return sum(self.links_up)

    @property
    def nvlink_bps(self) -> float:
        """Total per direction over the active links."""
        return self.nvlink_link_bps * self.links_active


@dataclass(slots=True)
class Counters:
    """Cumulative counters, kept as floats so slow rates still add up; reported floored."""

    pcie_replays: float = 0.0
    nvlink_tx_bytes: float = 0.0
    nvlink_rx_bytes: float = 0.0
    nvlink_crc_flit: float = 0.0
    nvlink_crc_data: float = 0.0
    nvlink_replay: float = 0.0
    nvlink_recovery: float = 0.0
    ecc_corrected: float = 0.0
    ecc_uncorrected: float = 0.0
    remap_correctable: int = 0
    remap_uncorrectable: int = 0
    tensor_active_s: float = 0.0  # seconds of tensor-pipe activity: GPM samples snapshot it
    gr_active_s: float = 0.0  # seconds of graphics/compute-engine activity (GPM)
    dram_active_s: float = 0.0  # seconds at full DRAM bandwidth (GPM)
    energy_mj: float = 0.0  # millijoules since the driver loaded (nvmlDeviceGetTotalEnergyConsumption)
