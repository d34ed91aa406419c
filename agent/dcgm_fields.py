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
from agent.fields import GPU_READINGS, NIC_READINGS, Reading

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
    divisor: float | None = None  # exported as reading / divisor
    flag: bool = False  # a bool reading, exported as 0/1


def _from_table(reading: Reading) -> DcgmField:
    series = reading.series
    return DcgmField(series.name, series.type, series.help, reading.name, series.extra, series.divisor, reading.type is bool)


# What dcgm-exporter reports in other units or as combinations of readings: computed by _derive.
DERIVED_FIELDS: tuple[DcgmField, ...] = (
    DcgmField("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", "_fb_free_mib"),
    DcgmField("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", "_fb_used_mib"),
    DcgmField("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "untyped",
              "Total number of NVLink bandwidth counters for all lanes (bytes transmitted plus received).", "_nvlink_bytes"),
)
# Every GPU reading with a series in agent/fields.py, then the derived ones.
DCGM_FIELDS: tuple[DcgmField, ...] = (*(_from_table(r) for r in GPU_READINGS if r.series is not None), *DERIVED_FIELDS)
XID_FIELD = DcgmField("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", "xid")

# The wire readings each derived key is made of.
DERIVED_FROM: dict[str, tuple[str, ...]] = {
    "_fb_used_mib": ("mem_used_bytes", "mem_reserved_bytes"),
    "_fb_free_mib": ("mem_total_bytes", "mem_used_bytes"),
    "_nvlink_bytes": ("nvlink_tx_bytes_total", "nvlink_rx_bytes_total"),
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
    """Add the readings dcgm-exporter reports as combinations of ours (in place)."""
    total, used, reserved = m.get("mem_total_bytes"), m.get("mem_used_bytes"), m.get("mem_reserved_bytes")
    # mem_used_bytes includes what the driver reserves (NVML's v1 "used"); dcgm-exporter's FB_USED
    # does not: FB_USED + FB_FREE + FB_RESERVED = the total. From an agent that does not send
    # the reserved part, FB_USED includes it and there is no FB_RESERVED series.
    m["_fb_used_mib"] = None if used is None else max(0, used - (reserved or 0)) / MIB
    m["_fb_free_mib"] = None if total is None or used is None else (total - used) / MIB
    tx, rx = m.get("nvlink_tx_bytes_total"), m.get("nvlink_rx_bytes_total")
    m["_nvlink_bytes"] = None if tx is None or rx is None else tx + rx
    return m


def _exported(values: list[Any], field: DcgmField) -> list[Any]:
    """Readings as dcgm-exporter writes them: flags as 0/1, percentages as ratios."""
    if field.divisor is not None:
        return [None if v is None else v / field.divisor for v in values]
    if field.flag:
        return [None if v is None else int(v) for v in values]
    return values


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
        values = _exported([m.get(field.key) for m in readings], field)
        if None in values:
            fam.keys = [labels for labels, v in zip(labels_list, values) if v is not None]
            fam.values = [v for v in values if v is not None]
        else:
            fam.keys, fam.values = list(labels_list), values
        families.append(fam)
    return families


NIC_LABELS = ("cluster", "node", "device", "port")
_NIC_COUNTERS = tuple((r.name, r.series.name, r.series.help) for r in NIC_READINGS if r.series is not None)


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
