"""Time-series charts as SVG text, drawn on the server: one GPU's line against its peer group's
median and spread band, the episode's span shaded, onset / detection / resolution marked, and
under the plot one lane per clock-event reason bit showing when it was set.

Pure: numbers in, a string out (every text through html.escape), no JavaScript and no library,
so the page needs no build step and ships nothing but this module (docs/ui.md). The SVG scales
with its container (viewBox, width 100%); colours are presentation attributes, not inline
styles, so the page's Content-Security-Policy (style-src 'self') allows them."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

Point = tuple[float, float | None]  # (ts, value); None: no value (a gap)
BandPoint = tuple[float, float, float, float]  # (ts, low, median, high)

GPU_COLOUR = "#c62828"
MEDIAN_COLOUR = "#37474f"
BAND_COLOUR = "#90a4ae"
SPAN_COLOUR = "#ffcc80"
REASON_COLOURS = ("#6a1b9a", "#ef6c00", "#1565c0", "#2e7d32", "#ad1457", "#4e342e", "#00838f", "#9e9d24", "#5d4037")


@dataclass(frozen=True)
class Span:
    """A stretch of time a clock-event reason bit was set."""

    name: str
    start: float
    end: float


@dataclass(frozen=True)
class Mark:
    """A vertical line at an instant (onset, detection, resolution)."""

    ts: float
    label: str


@dataclass
class Chart:
    title: str
    unit: str
    since: float
    until: float
    gpu: Sequence[Point] = ()
    gpu_label: str = "this GPU"
    band: Sequence[BandPoint] = ()
    band_label: str = "peers"
    spans: Sequence[Span] = ()
    marks: Sequence[Mark] = ()
    shade: tuple[float, float] | None = None  # the episode, from onset to resolution (or now)
    width: int = 760
    height: int = 240
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Frame:
    left: float
    top: float
    right: float
    bottom: float
    x0: float
    x1: float
    y0: float
    y1: float

    def x(self, ts: float) -> float:
        return self.left + (ts - self.x0) / (self.x1 - self.x0) * (self.right - self.left)

    def y(self, value: float) -> float:
        return self.bottom - (value - self.y0) / (self.y1 - self.y0) * (self.bottom - self.top)


LEFT, RIGHT, TOP, AXIS, LANE = 64.0, 12.0, 30.0, 24.0, 15.0


def render(chart: Chart) -> str:
    """The chart as an <svg> element."""
    lanes = _lanes(chart.spans)
    plot_bottom = chart.height - AXIS - LANE * len(lanes)
    lo, hi = _value_range(chart)
    ticks = nice_ticks(lo, hi)
    frame = _Frame(LEFT, TOP, chart.width - RIGHT, plot_bottom, chart.since, max(chart.until, chart.since + 1), ticks[0], ticks[-1])
    label = f"{chart.title} ({chart.unit}): {chart.gpu_label} against {chart.band_label}"
    parts = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {chart.width} {chart.height}" role="img" '
        f'aria-label="{escape(label)}" preserveAspectRatio="xMidYMid meet" font-family="sans-serif" font-size="11">',
        f"<title>{escape(label)}</title>",
        _legend(chart),
        _shade(chart, frame),
        _y_axis(frame, ticks, chart.unit),
        _x_axis(frame, chart.height - AXIS - LANE * len(lanes)),
        _band(chart.band, frame),
        _median(chart.band, frame),
        _gpu_line(chart.gpu, frame),
        _marks(chart.marks, frame),
        _reason_lanes(lanes, frame),
    ]
    if not any(v is not None for _, v in chart.gpu) and not chart.band:
        parts.append(f'<text class="no-data" x="{(frame.left + frame.right) / 2:.1f}" y="{(frame.top + frame.bottom) / 2:.1f}" '
                     'text-anchor="middle" fill="#555">no samples in this window</text>')
    parts.append("</svg>")
    return "".join(p for p in parts if p)


# --- scales ---------------------------------------------------------------------------------


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi]: steps of 1, 2 or 5 × 10^k."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        lo, hi = 0.0, 1.0
    if hi - lo < 1e-9:
        pad = abs(hi) * 0.05 or 1.0
        lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / max(count - 1, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    first = math.floor(lo / step) * step
    ticks = []
    value = first
    while value < hi + step * 0.5 and len(ticks) < 50:
        ticks.append(round(value, 10))
        value += step
    if ticks[-1] < hi:
        ticks.append(round(ticks[-1] + step, 10))
    return ticks


def time_ticks(x0: float, x1: float, count: int = 6) -> list[float]:
    """Tick instants at round seconds/minutes/hours (UTC) within [x0, x1]."""
    span = max(x1 - x0, 1.0)
    steps = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
    step = next((s for s in steps if span / s <= count), 86400 * math.ceil(span / 86400 / count))
    first = math.ceil(x0 / step) * step
    return [first + i * step for i in range(int((x1 - first) // step) + 1)]


def _value_range(chart: Chart) -> tuple[float, float]:
    values = [v for _, v in chart.gpu if v is not None]
    values += [v for _, lo, med, hi in chart.band for v in (lo, med, hi)]
    values = [v for v in values if math.isfinite(v)]
    if not values:
        return 0.0, 1.0
    lo, hi = min(values), max(values)
    if lo >= 0 and lo < (hi - lo) * 0.5:
        lo = 0.0  # close enough to zero: show it, so a drop is not exaggerated
    return lo, hi


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.0f}"
    if abs(value) >= 1:
        return f"{value:.1f}".rstrip("0").rstrip(".")
    return f"{value:.3g}"


def _clock(ts: float, span: float) -> str:
    fmt = "%H:%M:%S" if span < 600 else "%H:%M" if span < 2 * 86400 else "%m-%d %H:%M"
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime(fmt)


# --- pieces ---------------------------------------------------------------------------------


def _legend(chart: Chart) -> str:
    items = [
        (f'<line x1="0" y1="0" x2="18" y2="0" stroke="{GPU_COLOUR}" stroke-width="2.5"/>', chart.gpu_label),
        (f'<rect x="0" y="-5" width="18" height="10" fill="{BAND_COLOUR}" fill-opacity="0.45"/>', chart.band_label),
        (f'<line x1="0" y1="0" x2="18" y2="0" stroke="{MEDIAN_COLOUR}" stroke-width="1.5" stroke-dasharray="4 3"/>', "peer median"),
    ]
    out = [f'<text class="chart-title" x="{LEFT}" y="13" font-weight="bold" font-size="12">{escape(chart.title)} ({escape(chart.unit)})</text>']
    x = LEFT
    for swatch, text in items:
        out.append(f'<g class="legend-item" transform="translate({x:.0f},23)">{swatch}<text x="22" y="4">{escape(text)}</text></g>')
        x += 30 + 6.2 * len(text)
    return "".join(out)


def _shade(chart: Chart, f: _Frame) -> str:
    if chart.shade is None:
        return ""
    start, end = max(chart.shade[0], f.x0), min(chart.shade[1], f.x1)
    if end <= start:
        return ""
    return (f'<rect class="episode-span" x="{f.x(start):.1f}" y="{f.top:.1f}" width="{f.x(end) - f.x(start):.1f}" '
            f'height="{f.bottom - f.top:.1f}" fill="{SPAN_COLOUR}" fill-opacity="0.35"><title>the episode</title></rect>')


def _y_axis(f: _Frame, ticks: list[float], unit: str) -> str:
    out = ['<g class="y-axis">']
    for t in ticks:
        y = f.y(t)
        out.append(f'<line x1="{f.left:.1f}" y1="{y:.1f}" x2="{f.right:.1f}" y2="{y:.1f}" stroke="#e0e0e0"/>'
                   f'<text x="{f.left - 6:.1f}" y="{y + 4:.1f}" text-anchor="end" fill="#444">{escape(_fmt(t))}</text>')
    out.append(f'<text x="12" y="{(f.top + f.bottom) / 2:.1f}" transform="rotate(-90 12 {(f.top + f.bottom) / 2:.1f})" '
               f'text-anchor="middle" fill="#444">{escape(unit)}</text></g>')
    return "".join(out)


def _x_axis(f: _Frame, y: float) -> str:
    span = f.x1 - f.x0
    out = [f'<g class="x-axis"><line x1="{f.left:.1f}" y1="{f.bottom:.1f}" x2="{f.right:.1f}" y2="{f.bottom:.1f}" stroke="#888"/>']
    for t in time_ticks(f.x0, f.x1):
        x = f.x(t)
        out.append(f'<line x1="{x:.1f}" y1="{f.bottom:.1f}" x2="{x:.1f}" y2="{f.bottom + 4:.1f}" stroke="#888"/>'
                   f'<text x="{x:.1f}" y="{y + 16:.1f}" text-anchor="middle" fill="#444">{escape(_clock(t, span))}</text>')
    out.append(f'<text x="{f.right:.1f}" y="{y + 16:.1f}" text-anchor="end" fill="#888" font-size="9">UTC</text></g>')
    return "".join(out)


def _segments(points: Sequence[tuple[float, float | None]], gap: float) -> list[list[tuple[float, float]]]:
    """Runs of points with values, broken at None and at time gaps longer than `gap`."""
    runs: list[list[tuple[float, float]]] = []
    last_ts = None
    for ts, value in points:
        if value is None or not math.isfinite(value):
            last_ts = None
            continue
        if last_ts is None or ts - last_ts > gap:
            runs.append([])
        runs[-1].append((ts, value))
        last_ts = ts
    return runs


def _gap(points: Sequence[tuple[float, object]]) -> float:
    """Three times the median spacing: a longer hole is missing data, drawn as a break."""
    steps = sorted(b[0] - a[0] for a, b in zip(points, points[1:]) if b[0] > a[0])
    return 3 * steps[len(steps) // 2] if steps else math.inf


def _path(run: list[tuple[float, float]], f: _Frame) -> str:
    return " ".join(f"{'M' if i == 0 else 'L'}{f.x(t):.1f} {f.y(v):.1f}" for i, (t, v) in enumerate(run))


def _gpu_line(points: Sequence[Point], f: _Frame) -> str:
    runs = _segments(points, _gap(points))
    if not runs:
        return ""
    d = " ".join(_path(r, f) for r in runs)
    dots = "".join(f'<circle cx="{f.x(r[0][0]):.1f}" cy="{f.y(r[0][1]):.1f}" r="2" fill="{GPU_COLOUR}"/>' for r in runs if len(r) == 1)
    return (f'<path class="gpu-line" data-points="{sum(map(len, runs))}" d="{d}" fill="none" stroke="{GPU_COLOUR}" '
            f'stroke-width="2.2" stroke-linejoin="round"/>{dots}')


def _band(band: Sequence[BandPoint], f: _Frame) -> str:
    polys = []
    for run in _segments([(t, 0.0) for t, *_ in band], _gap(band)):
        times = {t for t, _ in run}
        pts = [b for b in band if b[0] in times]
        upper = [f"{f.x(t):.1f} {f.y(hi):.1f}" for t, _, _, hi in pts]
        lower = [f"{f.x(t):.1f} {f.y(lo):.1f}" for t, lo, _, _ in reversed(pts)]
        polys.append("M" + " L".join(upper + lower) + " Z")
    if not polys:
        return ""
    return (f'<path class="peer-band" data-points="{len(band)}" d="{" ".join(polys)}" fill="{BAND_COLOUR}" fill-opacity="0.45" '
            'stroke="none"/>')


def _median(band: Sequence[BandPoint], f: _Frame) -> str:
    runs = _segments([(t, med) for t, _, med, _ in band], _gap(band))
    if not runs:
        return ""
    d = " ".join(_path(r, f) for r in runs)
    return f'<path class="peer-median" d="{d}" fill="none" stroke="{MEDIAN_COLOUR}" stroke-width="1.5" stroke-dasharray="4 3"/>'


def _marks(marks: Sequence[Mark], f: _Frame) -> str:
    out = []
    for m in marks:
        if not f.x0 <= m.ts <= f.x1:
            continue
        x = f.x(m.ts)
        out.append(f'<g class="mark" data-mark="{escape(m.label)}"><line x1="{x:.1f}" y1="{f.top:.1f}" x2="{x:.1f}" y2="{f.bottom:.1f}" '
                   f'stroke="#333" stroke-dasharray="2 2"/><text x="{x + 3:.1f}" y="{f.top + 10:.1f}" fill="#333" font-size="10">'
                   f"{escape(m.label)}</text></g>")
    return "".join(out)


def _lanes(spans: Sequence[Span]) -> list[tuple[str, list[Span]]]:
    names: dict[str, list[Span]] = {}
    for s in spans:
        names.setdefault(s.name, []).append(s)
    return list(names.items())


def _reason_lanes(lanes: list[tuple[str, list[Span]]], f: _Frame) -> str:
    if not lanes:
        return ""
    out = ['<g class="reason-lanes">']
    for i, (name, spans) in enumerate(lanes):
        colour = REASON_COLOURS[i % len(REASON_COLOURS)]
        y = f.bottom + AXIS + i * LANE
        out.append(f'<text x="{f.left - 6:.1f}" y="{y + 10:.1f}" text-anchor="end" fill="{colour}" font-size="9">{escape(_short(name))}</text>')
        for s in spans:
            x0, x1 = f.x(max(s.start, f.x0)), f.x(min(s.end, f.x1))
            out.append(f'<rect class="reason-span" data-reason="{escape(name)}" x="{x0:.1f}" y="{y + 2:.1f}" width="{max(x1 - x0, 2):.1f}" '
                       f'height="{LANE - 4:.0f}" fill="{colour}" fill-opacity="0.8"><title>{escape(name)}</title></rect>')
    out.append("</g>")
    return "".join(out)


# Lane labels fit the left margin: NVML's reason names, shortened.
SHORT_NAMES = {"GPU idle": "idle", "applications clocks setting": "app clocks", "SW power cap": "SW power", "HW slowdown": "HW slow",
               "sync boost": "sync boost", "SW thermal slowdown": "SW thermal", "HW thermal slowdown": "HW thermal",
               "HW power brake": "HW brake", "display clock setting": "display"}


def _short(name: str) -> str:
    name = SHORT_NAMES.get(name, name)
    return name if len(name) <= 10 else name[:9] + "…"
