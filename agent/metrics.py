"""`laggard-agent --metrics-port`: this node's own latest readings in the Prometheus text format
(version 0.0.4), for sites that scrape nodes rather than (or as well as) the collector.

The agent ships alone with nvidia-ml-py and httpx only, so the exposition is written here by
hand (no prometheus_client). The same few pieces serve the collector's GET /metrics
(server/metrics), which needs a faster writer than prometheus_client's for 10,000 GPUs:

- DCGM_FIELDS: per-GPU readings under the names and labels NVIDIA dcgm-exporter uses
  (etc/default-counters.csv, dcp-metrics-included.csv), so dashboards built for dcgm-exporter
  work unchanged. dcgm-exporter declares some of these counters; their names do not end in
  `_total` (DCGM_FI_DEV_PCIE_REPLAY_COUNTER), which `promtool check metrics` rejects for a
  counter, so they are declared `untyped` here: rate() and increase() do not look at the type.
  DCGM_FI_PROF_PIPE_TENSOR_ACTIVE (a 0..1 ratio, like dcgm-exporter's) comes from NVML's GPM
  metrics (agent/nvml/readers/tensor_activity.py): only on Hopper and newer, and only from the
  second sampling cycle on; elsewhere the series is absent.
- Family and render(): a metric family and the text writer.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import operator
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple

from agent import __version__

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MIB = 1024 * 1024

# dcgm-exporter's label names, in its order, plus the cluster (which dcgm-exporter does not know).
# Its pci_bus_id and DCGM_FI_DRIVER_VERSION labels are left out: no dashboard selects on them, and
# at 10,000 GPUs they would add a third to the size of every scrape.
DCGM_LABELS = ("gpu", "UUID", "device", "modelName", "Hostname", "cluster")


# --- the exposition format ------------------------------------------------------------------


class Family:
    """One metric family, kept as columns: keys[i] (label values, in labelnames order) goes with
    values[i] (an int or a float). A histogram keeps (label values, [(le, cumulative count)...],
    sum, count) tuples in `hist`. Columns let 10,000 GPUs share one list of label tuples."""

    __slots__ = ("name", "type", "help", "labelnames", "keys", "values", "hist")

    def __init__(self, name: str, type: str, help: str, labelnames: Sequence[str] = ()):
        if type not in ("gauge", "counter", "untyped", "histogram"):
            raise ValueError(f"unknown metric type {type!r}")
        if type == "counter" and not name.endswith("_total"):
            raise ValueError(f"counter {name} must end in _total")
        self.name, self.type, self.help, self.labelnames = name, type, help, tuple(labelnames)
        self.keys: list[tuple] = []
        self.values: list = []
        self.hist: list[tuple] = []

    def add(self, values: Sequence[str], value: float) -> None:
        """value: an int or a float (a bool is stored as 0 or 1)."""
        self.keys.append(tuple(values))
        self.values.append(int(value) if isinstance(value, bool) else value)

    def add_histogram(self, values: Sequence[str], buckets: Sequence[tuple[float, float]], sum_value: float, count: float) -> None:
        self.hist.append((tuple(values), list(buckets), sum_value, count))

    @property
    def rows(self) -> list[tuple]:
        return list(self.hist) if self.type == "histogram" else list(zip(self.keys, self.values))

    def __repr__(self) -> str:
        return f"Family({self.name!r}, {self.type!r}, {len(self.rows)} rows)"


def escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    if type(value) is int:
        return str(value)
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def label_string(names: Sequence[str], values: Sequence[str]) -> str:
    if not names:
        return ""
    return "{" + ",".join(f'{n}="{escape_label_value(str(v))}"' for n, v in zip(names, values)) + "}"


def render(families: Iterable[Family]) -> str:
    """The text format (0.0.4) of these families."""
    return Renderer().render(families)


class Renderer:
    """The text writer, keeping the `name{labels} ` head of every line from one call to the next:
    a fleet's label sets rarely change between scrapes, and at 10,000 GPUs writing those heads is
    most of the work (bench/metrics.py). Only a cache: the output is the same with or without it.
    Safe to share between threads (an entry is replaced whole)."""

    def __init__(self) -> None:
        self._heads: dict[str, tuple[list[tuple], list[str]]] = {}

    def render(self, families: Iterable[Family]) -> str:
        out: list[str] = []
        append = out.append
        labels_text: dict[tuple[str, ...], dict[tuple, str]] = {}
        for fam in families:
            append(f"# HELP {fam.name} {_escape_help(fam.help)}\n# TYPE {fam.name} {fam.type}\n")
            if fam.type == "histogram":
                _render_histogram(fam, append)
                continue
            keys, values = fam.keys, fam.values
            if not keys:
                continue
            cached = self._heads.get(fam.name)
            if cached is None or cached[0] != keys:
                texts = labels_text.setdefault(fam.labelnames, {})
                heads = []
                for key in keys:
                    text = texts.get(key)
                    if text is None:
                        text = texts[key] = label_string(fam.labelnames, key)
                    heads.append(f"{fam.name}{text} ")
                cached = self._heads[fam.name] = (keys, heads)
            total = sum(values)
            if total - total == 0:  # all finite: repr() of an int or a float is a valid sample value
                append("\n".join(map(operator.add, cached[1], map(repr, values))))
            else:
                append("\n".join(map(operator.add, cached[1], map(format_value, values))))
            append("\n")
        return "".join(out)


def _render_histogram(fam: Family, append: Callable[[str], None]) -> None:
    names = fam.labelnames
    for values, buckets, sum_value, count in fam.hist:
        base = [f'{n}="{escape_label_value(str(v))}"' for n, v in zip(names, values)]
        for le, cumulative in buckets:
            bound = 'le="' + format_le(le) + '"'
            append(f"{fam.name}_bucket{{{','.join([*base, bound])}}} {format_value(cumulative)}\n")
        plain = "{" + ",".join(base) + "}" if base else ""
        append(f"{fam.name}_count{plain} {format_value(count)}\n")
        append(f"{fam.name}_sum{plain} {format_value(sum_value)}\n")


def format_le(le: float) -> str:
    """Bucket bounds as prometheus_client writes them (0.005, 1.0, +Inf)."""
    return "+Inf" if math.isinf(le) else repr(float(le))


# --- dcgm-exporter's per-GPU series ---------------------------------------------------------------


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
    DcgmField("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "gauge", "Effective power limit that the driver enforces (in W).", "power_limit_w"),
    DcgmField("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", "util_gpu_pct"),
    DcgmField("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", "util_mem_pct"),
    DcgmField("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor pipes are active.", "_tensor_active"),
    DcgmField("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", "_fb_free_mib"),
    DcgmField("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", "_fb_used_mib"),
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
    DcgmField("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "Whether remapping of rows is pending.", "_remap_pending", extra=True),
)
XID_FIELD = DcgmField("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", "xid")


def dcgm_labels(*, index: int, uuid: str, model: str | None, hostname: str, cluster: str) -> tuple[str, ...]:
    """One GPU's label values, in DCGM_LABELS order (device = the nvidia<minor> device name; the
    NVML index stands in for the minor number, as it does on almost every node)."""
    return (str(index), uuid, f"nvidia{index}", model or "", hostname, cluster)


def _derive(m: dict[str, Any]) -> dict[str, Any]:
    """Add the readings dcgm-exporter reports in other units or combinations (in place)."""
    total, used = m.get("mem_total_bytes"), m.get("mem_used_bytes")
    m["_fb_used_mib"] = None if used is None else used / MIB
    m["_fb_free_mib"] = None if total is None or used is None else (total - used) / MIB
    tx, rx = m.get("nvlink_tx_bytes_total"), m.get("nvlink_rx_bytes_total")
    m["_nvlink_bytes"] = None if tx is None or rx is None else tx + rx
    remap = m.get("remapped_rows_pending")
    m["_remap_pending"] = None if remap is None else int(remap)
    tensor = m.get("tensor_active_pct")
    m["_tensor_active"] = None if tensor is None else tensor / 100.0  # dcgm-exporter: a ratio
    return m


def dcgm_families(gpus: Iterable[tuple[tuple[str, ...], dict[str, Any]]], *, extra: bool = True) -> list[Family]:
    """DCGM families for (label values, latest readings) pairs; a reading that is None (not
    supported, or the GPU is lost: pass {}) is left out, as dcgm-exporter leaves out blank
    fields. The readings dicts are extended in place. extra=False: the default set only."""
    items = [(labels, _derive(m)) for labels, m in gpus if m]
    labels_list = [labels for labels, _ in items]
    readings = [m for _, m in items]
    families = []
    for field in DCGM_FIELDS:
        if field.extra and not extra:
            continue
        fam = Family(field.name, field.type, field.help, DCGM_LABELS)
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


# --- the agent's endpoint -------------------------------------------------------------------------


class NodeMetrics:
    """A sample sink that remembers the latest sample and hands every sample on (to the pusher).

    stale_after: /healthz fails once no sample has been taken for this long (an NVML call that
    hangs on a broken GPU stops the sampling loop without ending the process); None: never."""

    def __init__(self, sink, *, node: str, cluster: str, driver: str | None = None, stats: Callable[[], Mapping[str, float]] | None = None,
                 stale_after: float | None = None, clock: Callable[[], float] = time.monotonic):
        self.sink = sink
        self.node, self.cluster, self.driver = node, cluster, driver
        self.stats = stats
        self.latest = None
        self.samples = 0
        self.stale_after, self._clock = stale_after, clock
        self._last_taken = clock()  # the start counts as a sample: the first one may take a while
        self._xids: dict[str, int] = {}  # uuid → last XID seen
        self._xid_counts: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()
        self._renderer = Renderer()

    def submit(self, sample) -> None:
        with self._lock:
            self.latest = sample
            self.samples += 1
            self._last_taken = self._clock()
            for gpu in sample.gpus:
                for event in gpu.xids:
                    self._xids[gpu.uuid] = event.xid
                    key = (gpu.uuid, event.xid)
                    self._xid_counts[key] = self._xid_counts.get(key, 0) + 1
        if self.sink is not None:
            self.sink.submit(sample)

    def families(self) -> list[Family]:
        with self._lock:
            sample, xids, xid_counts, taken = self.latest, dict(self._xids), dict(self._xid_counts), self.samples
        families: list[Family] = []
        labels_by_uuid: dict[str, tuple[str, ...]] = {}
        gpus = []
        if sample is not None:
            for gpu in sample.gpus:
                labels = dcgm_labels(index=gpu.index, uuid=gpu.uuid, model=gpu.model, hostname=self.node, cluster=self.cluster)
                labels_by_uuid[gpu.uuid] = labels
                readings = {} if gpu.lost else dataclasses.asdict(gpu)
                gpus.append((labels, readings))
        families += dcgm_families(gpus)
        xid = Family(XID_FIELD.name, XID_FIELD.type, XID_FIELD.help, DCGM_LABELS)
        for uuid, last in sorted(xids.items()):
            if uuid in labels_by_uuid:
                xid.add(labels_by_uuid[uuid], last)
        families.append(xid)
        gpu_labels = ("cluster", "node", "gpu", "uuid")
        xid_total = Family("laggard_gpu_xid_errors_total", "counter", "XID events seen by this agent since it started.",
                           (*gpu_labels, "xid"))
        index_of = {g.uuid: g.index for g in sample.gpus} if sample is not None else {}
        for (uuid, code), n in sorted(xid_counts.items()):
            xid_total.add((self.cluster, self.node, str(index_of.get(uuid, "")), uuid, str(code)), n)
        families.append(xid_total)
        lost = Family("laggard_gpu_lost", "gauge", "1 when NVML reports the GPU lost or unreachable.", gpu_labels)
        for gpu in sample.gpus if sample is not None else ():
            lost.add((self.cluster, self.node, str(gpu.index), gpu.uuid), int(gpu.lost))
        families.append(lost)
        families += self._nic_families(sample)
        families += self._agent_families(sample, taken)
        return families

    def _nic_families(self, sample) -> list[Family]:
        return nic_families(((self.cluster, self.node, nic.device, str(nic.port)), dataclasses.asdict(nic))
                            for nic in (sample.nics if sample is not None else ()))

    def _agent_families(self, sample, taken: int) -> list[Family]:
        info = Family("laggard_agent_info", "gauge", "The agent's version and the NVIDIA driver's.", ("cluster", "node", "version", "driver"))
        info.add((self.cluster, self.node, __version__, self.driver or ""), 1)
        ts = Family("laggard_agent_last_sample_timestamp_seconds", "gauge", "Time of the latest sample (Unix seconds).", ("cluster", "node"))
        if sample is not None:
            ts.add((self.cluster, self.node), sample.ts)
        sampled = Family("laggard_agent_samples_total", "counter", "Samples taken since the agent started.", ("cluster", "node"))
        sampled.add((self.cluster, self.node), taken)
        out = [info, ts, sampled]
        stats = dict(self.stats()) if self.stats is not None else {}
        for key, name, text in (
            ("sent_samples", "laggard_agent_sent_samples_total", "Samples the collector acknowledged."),
            ("rejected_samples", "laggard_agent_rejected_samples_total", "Samples the collector rejected for good (dropped)."),
            ("failed_attempts", "laggard_agent_push_failures_total", "Push attempts that failed and will be retried."),
            ("refused_attempts", "laggard_agent_push_refusals_total",
             "Push attempts the collector refused with 401/403 (the token, --cluster or --node needs fixing); also failures."),
            ("dropped", "laggard_agent_dropped_samples_total", "Samples dropped from the full queue while the collector was away."),
            ("spool_corrupt", "laggard_agent_spool_corrupt_records_total", "Damaged spool records skipped (torn by a crash, or unreadable)."),
            ("spool_write_errors", "laggard_agent_spool_write_errors_total", "Spool writes the disk refused (samples then wait in memory)."),
        ):
            if key in stats:
                fam = Family(name, "counter", text, ("cluster", "node"))
                fam.add((self.cluster, self.node), stats[key])
                out.append(fam)
        if "queued" in stats:
            fam = Family("laggard_agent_queued_samples", "gauge", "Samples waiting to be pushed.", ("cluster", "node"))
            fam.add((self.cluster, self.node), stats["queued"])
            out.append(fam)
        if "spool_bytes" in stats:
            fam = Family("laggard_agent_spool_bytes", "gauge", "Size of the on-disk spool's files.", ("cluster", "node"))
            fam.add((self.cluster, self.node), stats["spool_bytes"])
            out.append(fam)
        return out

    def exposition(self) -> str:
        return self._renderer.render(self.families())

    def health(self) -> tuple[bool, dict[str, Any]]:
        """(healthy, details) for GET /healthz: healthy while samples keep coming."""
        with self._lock:
            age, taken = self._clock() - self._last_taken, self.samples
        healthy = self.stale_after is None or age <= self.stale_after
        return healthy, {"status": "ok" if healthy else "stale", "samples": taken,
                         "seconds_since_last_sample": round(age, 3), "stale_after_s": self.stale_after}


def pusher_stats(pusher) -> Callable[[], dict[str, float]]:
    def read() -> dict[str, float]:
        s = pusher.stats
        stats = {"sent_samples": s.sent_samples, "rejected_samples": s.rejected_samples, "failed_attempts": s.failed_attempts,
                 "refused_attempts": s.refused_attempts, "dropped": pusher.dropped, "queued": len(pusher.queue)}
        spool = pusher.queue
        if spool.durable:  # agent/spool.py's DiskSpool
            stats.update(spool_bytes=spool.size_bytes, spool_corrupt=spool.corrupt, spool_write_errors=spool.write_errors)
        return stats
    return read


def parse_listen(spec: str) -> tuple[str, int]:
    """"9400" → ("0.0.0.0", 9400); "127.0.0.1:9400" → ("127.0.0.1", 9400); "[::1]:9400" too."""
    host, sep, port = spec.rpartition(":")
    if not sep:
        host, port = "0.0.0.0", spec
    host = host.strip("[]") or "0.0.0.0"
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"--metrics-port {spec!r}: expected PORT or HOST:PORT") from None
    if not 0 <= number <= 65535:
        raise ValueError(f"--metrics-port {spec!r}: port out of range")
    return host, number


class _Server6(ThreadingHTTPServer):
    address_family = socket.AF_INET6


class MetricsServer:
    """GET /metrics and GET /healthz (200 while sampling, 503 once stale: the DaemonSet's
    liveness and readiness probes) on a daemon thread; anything else: 404."""

    def __init__(self, metrics: NodeMetrics, host: str, port: int):
        exposition, health = metrics.exposition, metrics.health

        class Handler(BaseHTTPRequestHandler):
            server_version = f"laggard-agent/{__version__}"

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._reply(200, CONTENT_TYPE, exposition().encode())
                elif path == "/healthz":
                    healthy, details = health()
                    self._reply(200 if healthy else 503, "application/json", json.dumps(details).encode())
                else:
                    self.send_error(404)

            def _reply(self, status: int, content_type: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:  # one line per scrape would flood the journal
                pass

        server_class = _Server6 if ":" in host else ThreadingHTTPServer
        self.httpd = server_class((host, port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="metrics", daemon=True)

    def start(self) -> "MetricsServer":
        self._thread.start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def start_metrics(spec: str, sink, *, node: str, cluster: str, driver: str | None, pusher=None,
                  stale_after: float | None = None) -> tuple[NodeMetrics, MetricsServer]:
    """The sink to hand the Runner, and the server (close() it on exit)."""
    host, port = parse_listen(spec)
    metrics = NodeMetrics(sink, node=node, cluster=cluster, driver=driver, stats=pusher_stats(pusher) if pusher is not None else None,
                          stale_after=stale_after)
    server = MetricsServer(metrics, host, port).start()
    log.info("metrics at http://%s:%d/metrics", host, server.port)
    return metrics, server


__all__ = [
    "CONTENT_TYPE", "DCGM_FIELDS", "DCGM_LABELS", "DcgmField", "Family", "MetricsServer", "NodeMetrics", "XID_FIELD",
    "NIC_LABELS", "Renderer", "dcgm_families", "dcgm_labels", "nic_families", "escape_label_value", "format_value", "label_string",
    "parse_listen", "render", "start_metrics",
]
