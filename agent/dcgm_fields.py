"""What a node's readings are called on /metrics: NVIDIA dcgm-exporter's per-GPU series and
Laggard's IB/RoCE port series, as data (one table), shared by the agent's own endpoint and the
collector's GET /metrics.

- DCGM_FIELDS: per-GPU readings under the names and labels NVIDIA dcgm-exporter uses
  (etc/default-counters.csv, dcp-metrics-included.csv), so dashboards built for dcgm-exporter
  work unchanged. dcgm-exporter declares some of these counters; their names do not end in
  `_total` (DCGM_FI_DEV_PCIE_REPLAY_COUNTER), which `promtool check metrics` rejects for a
  counter, so they are declared `untyped` here: rate() and increase() do not look at the type.
  DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, DCGM_FI_PROF_GR_ENGINE_ACTIVE and DCGM_FI_PROF_DRAM_ACTIVE (0..1
  ratios, like dcgm-exporter's) come from NVML's GPM metrics (agent/nvml/readers/tensor_activity.py):
  only on Hopper and newer, and only from the second sampling cycle on; elsewhere the series are
  absent.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from agent.exposition import Family

MIB = 1024 * 1024

# dcgm-exporter's label names, in its order, plus the cluster (which dcgm-exporter does not know).
# `Hostname` and `hostname` both: dcgm-exporter renamed the label in 2026 and dashboards select
# on one or the other. No `instance`: on the agent's own endpoint Prometheus adds the agent's
# address, as it does to dcgm-exporter's series.
DCGM_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "hostname", "DCGM_FI_DRIVER_VERSION", "cluster")
# On the collector, which serves every node's GPUs: `instance` = the node as well, so that with
# honor_labels in the scrape job each node's series look as if its own exporter served them
# (issue #16). Then dcgm-exporter's Kubernetes labels of the pod using the GPU, as the node's
# agent attributed it (issue #15; "" where none: no label). A label tuple is dcgm_labels(...) +
# (node, namespace, pod, container).
FLEET_DCGM_LABELS = (*DCGM_LABELS, "instance", "namespace", "pod", "container")


class DcgmField(NamedTuple):
    name: str
    type: str  # gauge | untyped (a counter whose name lacks _total)
    help: str
    key: str  # the reading (a wire field, or one derived by _derive)
    extra: bool = False  # not in dcgm-exporter's default set nor on a dashboard: the collector exports it on request


DCGM_FIELDS: tuple[DcgmField, ...] = (
    DcgmField("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", "sm_clock_mhz"),
    DcgmField("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", "mem_clock_mhz"),
    DcgmField("DCGM_FI_DEV_MAX_SM_CLOCK", "gauge", "Maximum SM clock frequency (in MHz).", "sm_clock_max_mhz", extra=True),
    DcgmField("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", "temp_c"),
    DcgmField("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", "mem_temp_c"),
    DcgmField("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", "power_w"),
    DcgmField("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "untyped", "Total energy consumed since the driver was last loaded (in mJ).",
              "energy_mj_total"),
    DcgmField("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "gauge", "Effective power limit that the driver enforces (in W).", "power_limit_w"),
    DcgmField("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", "util_gpu_pct"),
    DcgmField("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", "util_mem_pct"),
    DcgmField("DCGM_FI_DEV_ENC_UTIL", "gauge", "Video encoder utilization (in %).", "util_enc_pct"),
    DcgmField("DCGM_FI_DEV_DEC_UTIL", "gauge", "Video decoder utilization (in %).", "util_dec_pct"),
    DcgmField("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics/compute engine is active.", "_gr_engine_active"),
    DcgmField("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor pipes are active.", "_tensor_active"),
    DcgmField("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", "Ratio of the device memory bandwidth in use (DRAM active).", "_dram_active"),
    DcgmField("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", "_fb_free_mib"),
    DcgmField("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", "_fb_used_mib"),
    DcgmField("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved by the driver and firmware (in MiB).", "_fb_reserved_mib"),
    DcgmField("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gauge", "Current clock throttle reasons (bitmask of NVML clocks event reasons).",
              "clocks_event_reasons"),
    DcgmField("DCGM_FI_DEV_PCIE_LINK_GEN", "gauge", "PCIe current link generation.", "pcie_gen"),
    DcgmField("DCGM_FI_DEV_PCIE_MAX_LINK_GEN", "gauge", "PCIe max link generation.", "pcie_gen_max"),
    DcgmField("DCGM_FI_DEV_PCIE_LINK_WIDTH", "gauge", "PCIe current link width.", "pcie_width"),
    DcgmField("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", "gauge", "PCIe max link width.", "pcie_width_max"),
    DcgmField("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "untyped", "Total number of PCIe retries.", "pcie_replay_total"),
    DcgmField("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "The rate of data transmitted over the PCIe bus (in bytes per second).",
              "pcie_tx_bytes_per_s", extra=True),
    DcgmField("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", "The rate of data received over the PCIe bus (in bytes per second).",
              "pcie_rx_bytes_per_s", extra=True),
    DcgmField("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "untyped",
              "Total number of NVLink bandwidth counters for all lanes (bytes transmitted plus received).", "_nvlink_bytes"),
    DcgmField("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "untyped", "Total number of NVLink retries.", "nvlink_replay_errors_total", extra=True),
    DcgmField("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "untyped", "Total number of NVLink recovery errors.",
              "nvlink_recovery_errors_total", extra=True),
    DcgmField("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "untyped", "Total number of single-bit persistent ECC errors.", "ecc_corrected_total", extra=True),
    DcgmField("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "untyped", "Total number of double-bit persistent ECC errors.", "ecc_uncorrected_total", extra=True),
    DcgmField("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "untyped", "Number of rows remapped for correctable errors.",
              "remapped_rows_correctable_total"),
    DcgmField("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "untyped", "Number of rows remapped for uncorrectable errors.",
              "remapped_rows_uncorrectable_total"),
    DcgmField("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether a row remap has failed (1: no spare row left).", "_remap_failure"),
    DcgmField("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "Whether remapping of rows is pending.", "_remap_pending", extra=True),
)
XID_FIELD = DcgmField("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", "xid")

# The wire readings each derived key (a key starting with "_", computed by _derive) is made of.
DERIVED_FROM: dict[str, tuple[str, ...]] = {
    "_fb_used_mib": ("mem_used_bytes", "mem_reserved_bytes"),
    "_fb_free_mib": ("mem_total_bytes", "mem_used_bytes"),
    "_fb_reserved_mib": ("mem_reserved_bytes",),
    "_nvlink_bytes": ("nvlink_tx_bytes_total", "nvlink_rx_bytes_total"),
    "_remap_pending": ("remapped_rows_pending",),
    "_remap_failure": ("remapped_rows_failure",),
    "_tensor_active": ("tensor_active_pct",),
    "_gr_engine_active": ("gr_engine_active_pct",),
    "_dram_active": ("dram_active_pct",),
}


def dcgm_inputs(fields: tuple[DcgmField, ...] = DCGM_FIELDS) -> set[str]:
    """The wire readings these fields are made of: what a reader of stored samples must fetch."""
    out: set[str] = set()
    for f in fields:
        out.update(DERIVED_FROM[f.key] if f.key.startswith("_") else (f.key,))
    return out


def dcgm_labels(*, index: int, uuid: str, model: str | None, hostname: str, cluster: str, pci_bus_id: str | None,
                driver: str | None) -> tuple[str, ...]:
    """One GPU's label values, in DCGM_LABELS order. device: dcgm-exporter's is the nvidia<minor>
    device name; the NVML index stands in for the minor number (which the agent does not send),
    as it equals it on almost every node. pci_bus_id is NVML's, the form dcgm-exporter writes
    ("00000000:19:00.0"); driver: the node's driver version, as the agent reported it. Unknown
    values are "", which Prometheus stores as no label."""
    return (str(index), uuid, pci_bus_id or "", f"nvidia{index}", model or "", hostname, hostname, driver or "", cluster)


def _derive(m: dict[str, Any]) -> dict[str, Any]:
    """Add the readings dcgm-exporter reports in other units or combinations (in place)."""
    total, used, reserved = m.get("mem_total_bytes"), m.get("mem_used_bytes"), m.get("mem_reserved_bytes")
    # mem_used_bytes includes what the driver reserves (NVML's v1 "used"); dcgm-exporter's FB_USED
    # does not: FB_USED + FB_FREE + FB_RESERVED = the total. From an agent that does not send
    # the reserved part, FB_USED includes it and there is no FB_RESERVED series.
    m["_fb_used_mib"] = None if used is None else max(0, used - (reserved or 0)) / MIB
    m["_fb_free_mib"] = None if total is None or used is None else (total - used) / MIB
    m["_fb_reserved_mib"] = None if reserved is None else reserved / MIB
    tx, rx = m.get("nvlink_tx_bytes_total"), m.get("nvlink_rx_bytes_total")
    m["_nvlink_bytes"] = None if tx is None or rx is None else tx + rx
    remap = m.get("remapped_rows_pending")
    m["_remap_pending"] = None if remap is None else int(remap)
    failure = m.get("remapped_rows_failure")
    m["_remap_failure"] = None if failure is None else int(failure)
    tensor = m.get("tensor_active_pct")
    m["_tensor_active"] = None if tensor is None else tensor / 100.0  # dcgm-exporter: a ratio
    gr = m.get("gr_engine_active_pct")
    m["_gr_engine_active"] = None if gr is None else gr / 100.0
    dram = m.get("dram_active_pct")
    m["_dram_active"] = None if dram is None else dram / 100.0
    return m


def dcgm_families(gpus: Iterable[tuple[tuple[str, ...], dict[str, Any]]], *, extra: bool = True,
                  labelnames: tuple[str, ...] = DCGM_LABELS) -> list[Family]:
    """DCGM families for (label values in `labelnames` order, latest readings) pairs; a reading
    that is None (not supported, or the GPU is lost: pass {}) is left out, as dcgm-exporter
    leaves out blank fields. The readings dicts are extended in place. extra=False: the default
    set only."""
    items = [(labels, _derive(m)) for labels, m in gpus if m]
    labels_list = [labels for labels, _ in items]
    readings = [m for _, m in items]
    families = []
    for field in DCGM_FIELDS:
        if field.extra and not extra:
            continue
        fam = Family(field.name, field.type, field.help, labelnames)
        key = field.key
        values = [m.get(key) for m in readings]
        if None in values:
            fam.keys = [labels for labels, v in zip(labels_list, values) if v is not None]
            fam.values = [v for v in values if v is not None]
        else:
            fam.keys, fam.values = list(labels_list), values
        families.append(fam)
    return families


NIC_LABELS = ("cluster", "node", "device", "port")
_NIC_COUNTERS = (
    ("tx_bytes_total", "laggard_nic_transmit_bytes_total", "Bytes transmitted by the IB/RoCE port."),
    ("rx_bytes_total", "laggard_nic_receive_bytes_total", "Bytes received by the IB/RoCE port."),
    ("symbol_errors_total", "laggard_nic_symbol_errors_total", "Port symbol errors."),
    ("link_downed_total", "laggard_nic_link_downed_total", "Times the port link went down."),
    ("rcv_errors_total", "laggard_nic_receive_errors_total", "Port receive errors."),
    ("xmit_discards_total", "laggard_nic_transmit_discards_total", "Packets discarded by the port on transmit."),
    ("xmit_wait_total", "laggard_nic_transmit_wait_ticks_total", "Ticks the port had data to send but no credits to send it."),
)


def nic_families(ports: Iterable[tuple[tuple[str, ...], Mapping[str, Any]]]) -> list[Family]:
    """IB/RoCE port families for (label values in NIC_LABELS order, latest readings) pairs."""
    up = Family("laggard_nic_port_up", "gauge", "1 when the IB/RoCE port is ACTIVE.", NIC_LABELS)
    rate = Family("laggard_nic_link_rate_bytes_per_second", "gauge", "Port link rate (in bytes per second).", NIC_LABELS)
    fams = [Family(name, "counter", text, NIC_LABELS) for _, name, text in _NIC_COUNTERS]
    items = list(ports)
    for values, m in items:
        state = m.get("state")
        if state is not None:
            up.add(values, int(state.upper() == "ACTIVE"))
        if m.get("rate_gbps") is not None:
            rate.add(values, m["rate_gbps"] * 1e9 / 8)
    labels_list = [values for values, _ in items]
    for fam, (key, _, _) in zip(fams, _NIC_COUNTERS):
        column = [m.get(key) for _, m in items]
        if None in column:
            fam.keys = [k for k, v in zip(labels_list, column) if v is not None]
            fam.values = [v for v in column if v is not None]
        else:
            fam.keys, fam.values = list(labels_list), column
    return [up, rate, *fams]
