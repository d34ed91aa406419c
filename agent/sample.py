"""The one wide sample record that flows from the readers to the wire (protocol v1).

Field names are the wire names of docs/protocol.md. Every metric is optional: None means
"not supported or not readable", never zero.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any

from agent.workload.record import Workload

PROTOCOL_VERSION = 1


@dataclass(slots=True)
class XidEvent:
    xid: int
    ts: float


@dataclass(slots=True)
class GpuSample:
    index: int
    uuid: str
    model: str | None = None
    pci_bus_id: str | None = None
    # True when NVML reports the GPU lost or unreachable; the metrics are then all None.
    lost: bool = False
    temp_c: float | None = None
    mem_temp_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    mem_clock_mhz: int | None = None
    mem_clock_max_mhz: int | None = None
    util_gpu_pct: float | None = None
    util_mem_pct: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    clocks_event_reasons: int | None = None
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    pcie_replay_total: int | None = None
    pcie_tx_bytes_per_s: float | None = None
    pcie_rx_bytes_per_s: float | None = None
    nvlink_links_up: int | None = None
    nvlink_links_total: int | None = None
    nvlink_tx_bytes_total: int | None = None
    nvlink_rx_bytes_total: int | None = None
    nvlink_crc_errors_total: int | None = None
    nvlink_replay_errors_total: int | None = None
    nvlink_recovery_errors_total: int | None = None
    ecc_corrected_total: int | None = None
    ecc_uncorrected_total: int | None = None
    remapped_rows_pending: bool | None = None
    # GPM (Hopper+): % of cycles the tensor pipes were active between this sampling cycle and
    # the previous one; None on the first cycle and on GPUs without GPM.
    tensor_active_pct: float | None = None
    # dcgm-exporter's default set (issue #16). Cumulative energy since the driver loaded (mJ).
    energy_mj_total: int | None = None
    # Video encoder / decoder utilization (% of the driver's own sampling period).
    util_enc_pct: float | None = None
    util_dec_pct: float | None = None
    # Memory the driver and firmware set aside (nvmlMemory_v2_t.reserved): part of mem_used_bytes,
    # which keeps the v1 meaning (allocated + reserved). None from a driver without the v2 call.
    mem_reserved_bytes: int | None = None
    # Row remapping (Ampere+): rows remapped for correctable / uncorrectable errors, and whether
    # a remap failed (no spare row left).
    remapped_rows_correctable_total: int | None = None
    remapped_rows_uncorrectable_total: int | None = None
    remapped_rows_failure: bool | None = None
    # GPM (Hopper+), like tensor_active_pct: % of time the graphics/compute engine was active,
    # and % of the DRAM bandwidth used, between this sampling cycle and the previous one.
    gr_engine_active_pct: float | None = None
    dram_active_pct: float | None = None
    # What uses the GPU (issue #15, agent/workload/): None when unknown (attribution off or
    # failed); Workload(kind=None) when idle. Not a reading: not in GPU_METRIC_FIELDS.
    workload: Workload | None = None
    xids: list[XidEvent] = field(default_factory=list)


@dataclass(slots=True)
class NicSample:
    device: str
    port: int
    state: str | None = None
    rate_gbps: float | None = None
    tx_bytes_total: int | None = None
    rx_bytes_total: int | None = None
    symbol_errors_total: int | None = None
    link_downed_total: int | None = None
    rcv_errors_total: int | None = None
    xmit_discards_total: int | None = None
    xmit_wait_total: int | None = None


@dataclass(slots=True)
class Sample:
    ts: float
    gpus: list[GpuSample] = field(default_factory=list)
    nics: list[NicSample] = field(default_factory=list)


GPU_METRIC_FIELDS: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(GpuSample) if f.name not in {"index", "uuid", "model", "pci_bus_id", "lost", "workload", "xids"}
)


def sample_to_dict(sample: Sample) -> dict[str, Any]:
    return dataclasses.asdict(sample)


def build_batch(
    samples: list[Sample],
    *,
    node: str,
    cluster: str,
    labels: dict[str, str],
    agent_info: dict[str, str | None],
) -> dict[str, Any]:
    """The v1 request body for a batch of samples from one node."""
    return {
        "version": PROTOCOL_VERSION,
        "node": node,
        "cluster": cluster,
        "labels": labels,
        "agent": agent_info,
        "samples": [sample_to_dict(s) for s in samples],
    }



@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    # Fields this version does not know (written by a newer agent) are ignored; missing
    # ones (written by an older agent) take their defaults.
    names = _field_names(cls)
    return {k: v for k, v in data.items() if k in names}


def sample_from_dict(data: dict[str, Any]) -> Sample:
    """The inverse of sample_to_dict, for samples read back from the agent's spool.

    Raises ValueError when the dict is not a v1 sample (not a dict, no ts, a GPU without
    index/uuid, ...)."""
    try:
        gpus = []
        for g in data.get("gpus") or []:
            fields = _known(GpuSample, g)
            fields["xids"] = [XidEvent(**_known(XidEvent, x)) for x in g.get("xids") or []]
            workload = g.get("workload")
            fields["workload"] = Workload(**_known(Workload, workload)) if isinstance(workload, dict) else None
            gpus.append(GpuSample(**fields))
        nics = [NicSample(**_known(NicSample, n)) for n in data.get("nics") or []]
        return Sample(ts=float(data["ts"]), gpus=gpus, nics=nics)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a v1 sample: {type(exc).__name__}: {exc}") from None


def json_default(obj: object) -> dict[str, Any]:
    """json.dumps(default=...) for samples: a dataclass as a dict of its fields, shallow.

    The result equals json.dumps(sample_to_dict(sample)) at a fraction of the CPU:
    dataclasses.asdict deep-copies every field (it was most of the agent's encoding CPU)."""
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        raise TypeError(f"{type(obj).__name__} is not JSON serializable")
    return {name: getattr(obj, name) for name in _field_names(type(obj))}
