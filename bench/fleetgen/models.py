"""GPU models of the generated fleets, with the numbers NVML reports for them.

The same datasheet values agent/sim/models.py uses (H100: 1980 MHz max SM, 345 MHz idle, 700 W,
18 NVLinks, PCIe gen5 even when idle, as in the real 8×H100 dumps under
/work/shared/realdata/gpud-nvidia-smi-q-snapshots; A100: 1410 MHz, 400 W, 12 links, 55-62 °C
under gpu-burn per /work/shared/realdata/superbench-8gpu-logs), plus what a fleet generator needs
on top: idle PCIe generation, HBM temperature offset, the SXM bus ids of an 8-GPU board.
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1 << 20
GB = 1_000_000_000

# NVML clock-event reason bits.
IDLE = 0x1
APP_CLOCKS = 0x2
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SW_THERMAL = 0x20
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80

# Bus ids of the eight SXM GPUs of a DGX/HGX H100 board (A100 boards use other ids; any
# stable, distinct list does for the collector).
SXM_BUS_IDS = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")


@dataclass(frozen=True, slots=True)
class Model:
    key: str
    name: str  # nvmlDeviceGetName
    sm_max: int
    sm_idle: int
    mem_clock: int  # HBM: the same busy and idle
    power_limit: float  # default enforced limit, W
    power_idle: float
    mem_total: int
    mem_reserved: int
    nvlink_links: int
    nvlink_peak: float  # bytes/s per direction over all links (datasheet)
    pcie_gen_max: int
    pcie_gen_idle: int  # generation the link reports while the GPU idles
    temp_idle: float
    temp_busy: float  # at the power limit, median cooling, 25 °C inlet
    mem_temp_offset: float


H100 = Model("h100", "NVIDIA H100 80GB HBM3", 1980, 345, 2619, 700.0, 70.0, 81559 * MiB, 551 * MiB,
             18, 450 * GB, 5, 5, 34.0, 67.0, 8.0)
H200 = Model("h200", "NVIDIA H200", 1980, 345, 3201, 700.0, 76.0, 143771 * MiB, 580 * MiB,
             18, 450 * GB, 5, 5, 33.0, 66.0, 9.0)
# A100 boards here let the PCIe link drop to gen1 while idle (ASPM on), so an idle
# downtrained link is part of the noise a detector must ignore.
A100 = Model("a100", "NVIDIA A100-SXM4-80GB", 1410, 210, 1593, 400.0, 62.0, 81920 * MiB, 480 * MiB,
             12, 300 * GB, 4, 1, 31.0, 60.0, 6.0)

MODELS = {m.key: m for m in (H100, H200, A100)}
