"""The numbers behind a straggler's chart, pure: which metric a cause is about, one GPU's (or
port's) samples turned into that metric, its peers' samples turned into a median and spread band
over the same time buckets, and the stretches each clock-event reason bit was set.

Rows are dicts of one sample (`ts` and the stored columns, server/store/schema.py)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from server.peer_groups import is_busy
from server.ui.chart import BandPoint, Chart, Mark, Point, Span

# NVML's clocks-event reason bits (nvmlClocksEventReason*), as the page names them.
REASON_BITS: tuple[tuple[int, str], ...] = (
    (0x1, "GPU idle"), (0x2, "applications clocks setting"), (0x4, "SW power cap"), (0x8, "HW slowdown"),
    (0x10, "sync boost"), (0x20, "SW thermal slowdown"), (0x40, "HW thermal slowdown"), (0x80, "HW power brake"),
    (0x100, "display clock setting"),
)
BAND_LOW_Q, BAND_HIGH_Q = 0.1, 0.9


@dataclass(frozen=True)
class Metric:
    key: str
    title: str
    unit: str
    columns: tuple[str, ...]  # summed
    rate: bool = False  # the columns are counters: per second between samples
    scale: float = 1.0
    nic: bool = False  # a port's metric (nic_samples), not a GPU's
    busy_only: bool = True  # peers' samples count only while they are busy (as the detector judges)


METRICS: dict[str, Metric] = {m.key: m for m in (
    Metric("sm_clock_mhz", "SM clock", "MHz", ("sm_clock_mhz",)),
    Metric("temp_c", "GPU temperature", "°C", ("temp_c",)),
    Metric("power_w", "Power draw", "W", ("power_w",)),
    Metric("power_limit_w", "Enforced power limit", "W", ("power_limit_w",)),
    Metric("util_gpu_pct", "GPU utilisation", "%", ("util_gpu_pct",), busy_only=False),
    Metric("nvlink_gbps", "NVLink throughput (tx+rx)", "GB/s", ("nvlink_tx_bytes_total", "nvlink_rx_bytes_total"), rate=True, scale=1e-9),
    Metric("nvlink_links_up", "NVLink links up", "links", ("nvlink_links_up",), busy_only=False),
    Metric("nvlink_errors", "NVLink errors (CRC+replay+recovery)", "/s",
           ("nvlink_crc_errors_total", "nvlink_replay_errors_total", "nvlink_recovery_errors_total"), rate=True, busy_only=False),
    Metric("pcie_width", "PCIe link width", "lanes", ("pcie_width",)),
    Metric("pcie_gen", "PCIe link generation", "gen", ("pcie_gen",)),
    Metric("pcie_gbps", "PCIe throughput (tx+rx)", "GB/s", ("pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s"), scale=1e-9),
    Metric("pcie_replays", "PCIe replays", "/s", ("pcie_replay_total",), rate=True, busy_only=False),
    Metric("ecc_uncorrected", "Uncorrected ECC errors (total)", "errors", ("ecc_uncorrected_total",), busy_only=False),
    Metric("nic_gbps", "Port throughput (tx+rx)", "Gb/s", ("tx_bytes_total", "rx_bytes_total"), rate=True, scale=8e-9, nic=True,
           busy_only=False),
    Metric("nic_rate_gbps", "Port link rate", "Gb/s", ("rate_gbps",), nic=True, busy_only=False),
    Metric("nic_errors", "Port errors (symbol+receive)", "/s", ("symbol_errors_total", "rcv_errors_total"), rate=True, nic=True,
           busy_only=False),
    Metric("nic_wait", "Port transmit-wait", "ticks/s", ("xmit_wait_total",), rate=True, nic=True, busy_only=False),
)}

# The charts of an episode, the one that convinces first: what the cause is about.
CAUSE_CHARTS: dict[str, tuple[str, ...]] = {
    "clock": ("sm_clock_mhz", "temp_c"),
    "thermal": ("sm_clock_mhz", "temp_c"),
    "hw_slowdown": ("sm_clock_mhz", "temp_c"),
    "power": ("sm_clock_mhz", "power_w"),
    "nvlink": ("nvlink_gbps", "nvlink_links_up"),
    "pcie": ("pcie_width", "pcie_gbps"),
    "xid": ("sm_clock_mhz", "util_gpu_pct"),
    "ecc": ("ecc_uncorrected", "sm_clock_mhz"),
    "lost": ("util_gpu_pct",),
    "network": ("nic_gbps", "nic_rate_gbps"),
}
# The evidence's own headline metric (server/detect rules), where it names one the page can draw.
EVIDENCE_METRICS = {
    "sm_clock_mhz": "sm_clock_mhz", "power_limit_w": "power_limit_w", "nvlink_links_up": "nvlink_links_up", "nvlink_bps": "nvlink_gbps",
    "pcie_width": "pcie_width", "pcie_gen": "pcie_gen", "rate_gbps": "nic_rate_gbps", "bps": "nic_gbps", "errors_in_window": "nic_errors",
    "xmit_wait_per_s": "nic_wait", "ecc_uncorrected_new": "ecc_uncorrected",
}
MAX_CHARTS = 2


def charts_for(cause: str, evidence: Mapping[str, Any] | None) -> list[Metric]:
    """The metrics to chart for an episode: the evidence's headline first, then the cause's."""
    keys: list[str] = []
    headline = EVIDENCE_METRICS.get(str((evidence or {}).get("metric")))
    network = cause == "network"
    if headline is not None and METRICS[headline].nic == network:
        keys.append(headline)
    keys += [k for k in CAUSE_CHARTS.get(cause, ("sm_clock_mhz",)) if k not in keys]
    return [METRICS[k] for k in keys[:MAX_CHARTS]]


def reason_names(bits: int | None) -> list[str]:
    return [name for bit, name in REASON_BITS if bits and bits & bit]


def points(rows: Sequence[Mapping[str, Any]], metric: Metric) -> list[Point]:
    """One entity's samples (time order) as (ts, value) of the metric; counters become rates
    (a counter that went down — a reset — gives no value for that step)."""
    raw = [(float(r["ts"]), _sum(r, metric.columns)) for r in rows]
    if not metric.rate:
        return [(ts, v * metric.scale if v is not None else None) for ts, v in raw]
    out: list[Point] = []
    for (t0, v0), (t1, v1) in zip(raw, raw[1:]):
        ok = v0 is not None and v1 is not None and t1 > t0 and v1 >= v0
        out.append((t1, (v1 - v0) / (t1 - t0) * metric.scale if ok else None))
    return out


def _sum(row: Mapping[str, Any], columns: Iterable[str]) -> float | None:
    total = 0.0
    for c in columns:
        v = row.get(c)
        if v is None or isinstance(v, str):
            return None
        total += float(v)
    return total


def busy_rows(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The samples of a busy GPU (server/peer_groups.is_busy): what its peers are judged by."""
    return [r for r in rows if not r.get("lost") and is_busy(r.get("util_gpu_pct"), r.get("clocks_event_reasons"))]


def choose_step(since: float, until: float, interval: float | None, *, buckets: int = 240) -> float:
    """Bucket width: the window in about `buckets` steps, never finer than two sample intervals."""
    return max((until - since) / buckets, 2 * (interval or 1.0), 1.0)


def sample_interval(rows: Sequence[Mapping[str, Any]]) -> float | None:
    steps = sorted(b - a for a, b in zip((float(r["ts"]) for r in rows), (float(r["ts"]) for r in rows[1:])) if b > a)
    return steps[len(steps) // 2] if steps else None


def bucketed(pts: Iterable[Point], since: float, step: float) -> dict[int, float]:
    """Mean value per bucket index ((ts - since) // step), Nones left out."""
    sums: dict[int, list[float]] = {}
    for ts, v in pts:
        if v is None or not math.isfinite(v) or ts < since:
            continue
        acc = sums.setdefault(int((ts - since) // step), [0.0, 0.0])
        acc[0] += v
        acc[1] += 1
    return {i: s / n for i, (s, n) in sums.items()}


def line(pts: Iterable[Point], since: float, step: float) -> list[Point]:
    """The GPU's own line over the buckets, at their middles."""
    return [(since + (i + 0.5) * step, v) for i, v in sorted(bucketed(pts, since, step).items())]


def band(peers: Iterable[Iterable[Point]], since: float, step: float) -> tuple[list[BandPoint], int]:
    """Per bucket, across the peers that have a value in it: (middle, p10, median, p90); and how
    many peers contributed at all."""
    per_bucket: dict[int, list[float]] = {}
    contributing = 0
    for pts in peers:
        values = bucketed(pts, since, step)
        contributing += bool(values)
        for i, v in values.items():
            per_bucket.setdefault(i, []).append(v)
    out: list[BandPoint] = []
    for i in sorted(per_bucket):
        vs = sorted(per_bucket[i])
        out.append((since + (i + 0.5) * step, quantile(vs, BAND_LOW_Q), quantile(vs, 0.5), quantile(vs, BAND_HIGH_Q)))
    return out, contributing


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not sorted_values:
        raise ValueError("no values")
    pos = (len(sorted_values) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def reason_spans(rows: Sequence[Mapping[str, Any]], *, gap: float | None = None) -> list[Span]:
    """Per reason bit, the stretches of consecutive samples that had it set. A stretch ends half
    a sample interval after its last sample, or at a hole in the data longer than `gap`."""
    interval = sample_interval(rows) or 1.0
    gap = 3 * interval if gap is None else gap
    spans: list[Span] = []
    for bit, name in REASON_BITS:
        start = last = None
        for r in rows:
            ts, bits = float(r["ts"]), r.get("clocks_event_reasons")
            on = bits is not None and bool(bits & bit)
            if on and start is not None and ts - last > gap:
                spans.append(Span(name, start, last + interval / 2))
                start = None
            if on:
                start = ts if start is None else start
                last = ts
            elif start is not None:
                spans.append(Span(name, start, last + interval / 2))
                start = None
        if start is not None:
            spans.append(Span(name, start, last + interval / 2))
    return spans


def episode_window(onset: float, resolved_at: float | None, now: float, *, max_s: float = 3600.0) -> tuple[float, float]:
    """The chart's time range: some time before the onset (as much as the episode lasted, 2 to 15
    minutes), to a minute after the resolution or to now; at most `max_s`, the latest part."""
    end = now if resolved_at is None else min(resolved_at + 60.0, max(now, resolved_at))
    end = max(end, onset + 1.0)
    lasted = (resolved_at if resolved_at is not None else end) - onset
    before = min(max(lasted, 120.0), 900.0)
    since = onset - before
    return max(since, end - max_s), end


def build_chart(metric: Metric, ep: Mapping[str, Any], target: Sequence[Mapping[str, Any]], peers: Mapping[Any, Sequence[Mapping[str, Any]]],
                *, since: float, until: float, target_label: str) -> Chart:
    """One chart of an episode: the target's (GPU's or port's) metric against its peers' band."""
    interval = sample_interval(target) or next((sample_interval(rows) for rows in peers.values() if len(rows) > 1), None)
    step = choose_step(since, until, interval)
    own = line(points(target, metric), since, step)
    spread, count = band((points(busy_rows(rows) if metric.busy_only else rows, metric) for rows in peers.values()), since, step)
    what = "busy peers" if metric.busy_only else "peers"
    chart = Chart(title=metric.title, unit=metric.unit, since=since, until=until, gpu=own, gpu_label=target_label, band=spread,
                  band_label=f"{what} p10–p90 (n={count})", spans=[] if metric.nic else reason_spans(target),
                  marks=episode_marks(ep, since, until), shade=(ep["onset"], ep.get("resolved_at") or until))
    if not count:
        chart.notes.append("no peer reported this metric in the window: no band")
    return chart


def episode_marks(ep: Mapping[str, Any], since: float, until: float) -> list[Mark]:
    """Onset, detection and resolution; onset and detection as one mark when too close to tell apart."""
    close = abs(ep["detected_at"] - ep["onset"]) < (until - since) / 40
    marks = [Mark(ep["onset"], "onset · detected" if close else "onset")]
    if not close:
        marks.append(Mark(ep["detected_at"], "detected"))
    if ep.get("resolved_at") is not None:
        marks.append(Mark(ep["resolved_at"], "resolved"))
    return marks
