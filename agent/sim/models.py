"""GPU models the simulator knows, with the numbers NVML reports for them.

Values come from datasheets and, where we have them, real `nvidia-smi -q` dumps in
/work/shared/realdata (H100: idle 345 MHz SM / 2619 MHz HBM / ~70 W / PCIe gen5 even when
idle / 81559 MiB total / HBM ~8 °C above the core; RTX 4090: idle 210 MHz, PCIe drops to
gen1, no memory temperature or ECC). Memory totals are what NVML reports (a little under
the marketing size), not the marketing size.
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1 << 20
GB = 1_000_000_000


@dataclass(frozen=True, slots=True)
class GpuModel:
    key: str
    name: str  # nvmlDeviceGetName
    pci_device_id: int  # (device << 16) | vendor, as nvmlPciInfo_t.pciDeviceId
    sm_clock_max_mhz: int
    sm_clock_idle_mhz: int
    mem_clock_max_mhz: int
    mem_clock_busy_mhz: int  # GDDR parts run a bit below their max under load
    mem_clock_idle_mhz: int  # HBM parts do not downclock memory when idle
    power_limit_w: float  # default = enforced limit
    power_idle_w: float
    memory_total_bytes: int
    memory_reserved_bytes: int  # driver-reserved, shows as "used" on an idle GPU
    nvlink_links: int  # 0: no NVLink, NvLinkState answers NotSupported
    nvlink_link_bytes_per_s: float  # peak per link per direction
    pcie_gen_max: int
    pcie_width_max: int
    pcie_gen_idle: int  # consumer parts drop the link to gen1 when idle
    temp_idle_c: float
    temp_busy_c: float
    mem_temp_offset_c: float | None  # HBM sensor vs core; None: memory temp NotSupported
    ecc: bool  # ECC counters (NotSupported on GeForce)
    row_remapping: bool  # Ampere+ datacenter parts
    gpm: bool = False  # GPU Performance Monitoring (Hopper+ datacenter parts); else NotSupported
    tensor_busy_pct: float = 0.0  # typical % of cycles with tensor pipes active in a busy training step (GPM models)
    dram_busy_pct: float = 0.0  # typical % of peak DRAM bandwidth used in a busy training step (GPM models)


H100_SXM5_80GB = GpuModel(
    key="h100",
    name="NVIDIA H100 80GB HBM3",
    pci_device_id=0x233010DE,
    sm_clock_max_mhz=1980,
    sm_clock_idle_mhz=345,
    mem_clock_max_mhz=2619,
    mem_clock_busy_mhz=2619,
    mem_clock_idle_mhz=2619,
    power_limit_w=700.0,
    power_idle_w=70.0,
    memory_total_bytes=81559 * MiB,
    memory_reserved_bytes=551 * MiB,
    nvlink_links=18,  # NVLink 4: 18 x 50 GB/s bidirectional = 900 GB/s
    nvlink_link_bytes_per_s=25 * GB,
    pcie_gen_max=5,
    pcie_width_max=16,
    pcie_gen_idle=5,
    temp_idle_c=34.0,
    temp_busy_c=67.0,
    mem_temp_offset_c=8.0,
    ecc=True,
    row_remapping=True,
    gpm=True,
    tensor_busy_pct=55.0,
    dram_busy_pct=45.0,
)

H200_SXM_141GB = GpuModel(
    key="h200",
    name="NVIDIA H200",
    pci_device_id=0x233510DE,
    sm_clock_max_mhz=1980,
    sm_clock_idle_mhz=345,
    mem_clock_max_mhz=3201,
    mem_clock_busy_mhz=3201,
    mem_clock_idle_mhz=3201,
    power_limit_w=700.0,
    power_idle_w=76.0,
    memory_total_bytes=143771 * MiB,
    memory_reserved_bytes=580 * MiB,
    nvlink_links=18,
    nvlink_link_bytes_per_s=25 * GB,
    pcie_gen_max=5,
    pcie_width_max=16,
    pcie_gen_idle=5,
    temp_idle_c=33.0,
    temp_busy_c=66.0,
    mem_temp_offset_c=9.0,
    ecc=True,
    row_remapping=True,
    gpm=True,
    tensor_busy_pct=55.0,
    dram_busy_pct=45.0,
)

A100_SXM4_80GB = GpuModel(
    key="a100",
    name="NVIDIA A100-SXM4-80GB",
    pci_device_id=0x20B210DE,
    sm_clock_max_mhz=1410,
    sm_clock_idle_mhz=210,
    mem_clock_max_mhz=1593,
    mem_clock_busy_mhz=1593,
    mem_clock_idle_mhz=1593,
    power_limit_w=400.0,
    power_idle_w=62.0,
    memory_total_bytes=81920 * MiB,
    memory_reserved_bytes=480 * MiB,
    nvlink_links=12,  # NVLink 3: 12 x 25 GB/s per direction (realdata nvlink status file)
    nvlink_link_bytes_per_s=25 * GB,
    pcie_gen_max=4,
    pcie_width_max=16,
    pcie_gen_idle=4,
    temp_idle_c=31.0,
    temp_busy_c=60.0,  # gpu-burn on 8x A100 in realdata: 55-62 °C
    mem_temp_offset_c=6.0,
    ecc=True,
    row_remapping=True,
)

# A PCIe consumer card: the model where NVLink, memory temperature, ECC and row remapping
# are all NotSupported, as on the real 8x 4090 node in realdata.
RTX_4090 = GpuModel(
    key="rtx4090",
    name="NVIDIA GeForce RTX 4090",
    pci_device_id=0x268410DE,
    sm_clock_max_mhz=3105,
    sm_clock_idle_mhz=210,
    mem_clock_max_mhz=10501,
    mem_clock_busy_mhz=10251,
    mem_clock_idle_mhz=405,
    power_limit_w=450.0,
    power_idle_w=20.0,
    memory_total_bytes=24564 * MiB,
    memory_reserved_bytes=300 * MiB,
    nvlink_links=0,
    nvlink_link_bytes_per_s=0.0,
    pcie_gen_max=4,
    pcie_width_max=16,
    pcie_gen_idle=1,
    temp_idle_c=31.0,
    temp_busy_c=73.0,
    mem_temp_offset_c=None,
    ecc=False,
    row_remapping=False,
)

MODELS: dict[str, GpuModel] = {m.key: m for m in (H100_SXM5_80GB, H200_SXM_141GB, A100_SXM4_80GB, RTX_4090)}


def get_model(name: str | GpuModel) -> GpuModel:
    """A model by key ("h100", "H200", "a100", "rtx4090"), or the model itself."""
    if isinstance(name, GpuModel):
        return name
    key = name.strip().lower().replace("-", "").replace("_", "").replace(" ", "")
    if key in MODELS:
        return MODELS[key]
    raise ValueError(f"unknown GPU model {name!r}; known: {', '.join(sorted(MODELS))}")


def power_and_clock(model: GpuModel, demand_w: float, cap_w: float, rng) -> tuple[float, float, bool]:
    """(power W, SM clock MHz, capped) for a busy GPU that would draw `demand_w` uncapped.

    At the cap the power controller trades clock for power (SW Power Cap); roughly
    P ~ f^1.4 near the top of the V/f curve, so f scales as (cap/demand)^0.7.
    """
    if demand_w >= cap_w:
        power = cap_w * rng.uniform(0.975, 0.998)
        clock = model.sm_clock_max_mhz * (cap_w / demand_w) ** 0.7
        return power, clock, True
    return demand_w, model.sm_clock_max_mhz - 15 * rng.randint(0, 2), False
