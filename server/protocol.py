"""Wire protocol v1 (docs/protocol.md): what an agent may POST to /api/v1/samples.

Validation runs on the raw JSON bytes (pydantic-core), strict about types, so "5" is not a
temperature and NaN/Infinity are refused. Unknown fields are ignored so that newer agents can
talk to older collectors.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

Name = Annotated[str, Field(min_length=1, max_length=253)]
# Counters are stored as signed 64-bit integers (PostgreSQL BIGINT).
Count = Annotated[int, Field(ge=0, le=2**63 - 1)]
NonNeg = Annotated[float, Field(ge=0)]
Pct = Annotated[float, Field(ge=0, le=100)]
Celsius = Annotated[float, Field(ge=-50, le=200)]


class _Wire(BaseModel):
    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="ignore", frozen=True)


class Xid(_Wire):
    xid: Annotated[int, Field(ge=0)]
    ts: float


class Gpu(_Wire):
    index: Annotated[int, Field(ge=0, le=1023)]
    uuid: Name
    model: Annotated[str, Field(max_length=128)] | None = None
    pci_bus_id: Annotated[str, Field(max_length=64)] | None = None
    lost: bool = False
    temp_c: Celsius | None = None
    mem_temp_c: Celsius | None = None
    power_w: NonNeg | None = None
    power_limit_w: NonNeg | None = None
    sm_clock_mhz: Count | None = None
    sm_clock_max_mhz: Count | None = None
    mem_clock_mhz: Count | None = None
    mem_clock_max_mhz: Count | None = None
    util_gpu_pct: Pct | None = None
    util_mem_pct: Pct | None = None
    mem_used_bytes: Count | None = None
    mem_total_bytes: Count | None = None
    clocks_event_reasons: Count | None = None
    pcie_gen: Count | None = None
    pcie_gen_max: Count | None = None
    pcie_width: Count | None = None
    pcie_width_max: Count | None = None
    pcie_replay_total: Count | None = None
    pcie_tx_bytes_per_s: NonNeg | None = None
    pcie_rx_bytes_per_s: NonNeg | None = None
    nvlink_links_up: Count | None = None
    nvlink_links_total: Count | None = None
    nvlink_tx_bytes_total: Count | None = None
    nvlink_rx_bytes_total: Count | None = None
    nvlink_crc_errors_total: Count | None = None
    nvlink_replay_errors_total: Count | None = None
    nvlink_recovery_errors_total: Count | None = None
    ecc_corrected_total: Count | None = None
    ecc_uncorrected_total: Count | None = None
    remapped_rows_pending: bool | None = None
    xids: list[Xid] = []


class Nic(_Wire):
    device: Name
    port: Annotated[int, Field(ge=0, le=255)]
    state: Annotated[str, Field(max_length=32)] | None = None
    rate_gbps: NonNeg | None = None
    tx_bytes_total: Count | None = None
    rx_bytes_total: Count | None = None
    symbol_errors_total: Count | None = None
    link_downed_total: Count | None = None
    rcv_errors_total: Count | None = None
    xmit_discards_total: Count | None = None
    xmit_wait_total: Count | None = None


class SampleIn(_Wire):
    ts: Annotated[float, Field(gt=0)]
    gpus: list[Gpu] = []
    nics: list[Nic] = []


class AgentInfo(_Wire):
    version: Annotated[str, Field(max_length=64)] | None = None
    driver: Annotated[str, Field(max_length=64)] | None = None
    cuda: Annotated[str, Field(max_length=64)] | None = None


class Batch(_Wire):
    version: Literal[1]
    node: Name
    cluster: Name = "default"
    labels: dict[Annotated[str, Field(max_length=63)], Annotated[str, Field(max_length=253)]] = {}
    agent: AgentInfo | None = None
    samples: list[SampleIn]


GPU_METRICS: tuple[str, ...] = tuple(
    name for name in Gpu.model_fields if name not in {"index", "uuid", "model", "pci_bus_id", "xids"}
)
NIC_METRICS: tuple[str, ...] = tuple(name for name in Nic.model_fields if name not in {"device", "port"})
