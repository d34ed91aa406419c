"""The SVG chart module: well-formed SVG, the GPU's line, the peers' band and median, gaps,
reason-bit lanes, marks, escaping; and its scales."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from server.ui.chart import Chart, Mark, Span, nice_ticks, render, time_ticks

NS = {"s": "http://www.w3.org/2000/svg"}
T0 = 1_700_000_000.0


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def by_class(root: ET.Element, css: str) -> list[ET.Element]:
    return [el for el in root.iter() if css in (el.get("class") or "").split()]


def coords(d: str) -> list[tuple[str, float, float]]:
    return [(cmd, float(x), float(y)) for cmd, x, y in re.findall(r"([MLZ])\s*(-?[\d.]+)\s+(-?[\d.]+)", d)]


def chart(**kw) -> Chart:
    base = dict(title="SM clock", unit="MHz", since=T0, until=T0 + 100,
                gpu=[(T0 + i, 1900.0 if i < 50 else 1000.0) for i in range(100)],
                band=[(T0 + i, 1880.0, 1950.0, 1975.0) for i in range(100)], gpu_label="node-1 GPU 3", band_label="busy peers p10–p90 (n=7)")
    return Chart(**{**base, **kw})


def test_the_gpu_line_the_band_and_the_median_are_drawn():
    root = parse(render(chart(shade=(T0 + 50, T0 + 100))))
    assert root.tag == "{http://www.w3.org/2000/svg}svg" and root.get("viewBox") == "0 0 760 240"
    (line,) = by_class(root, "gpu-line")
    (band,) = by_class(root, "peer-band")
    (median,) = by_class(root, "peer-median")
    assert line.get("data-points") == "100" and band.get("data-points") == "100"
    assert by_class(root, "episode-span")
    # SVG y grows downwards: the slow half of the GPU's line lies below the band's lowest edge.
    ys = [y for _, _, y in coords(line.get("d"))]
    band_low = max(y for _, _, y in coords(band.get("d")))
    assert min(ys[50:]) > band_low and max(ys[:50]) <= band_low
    assert coords(median.get("d"))[0][0] == "M"
    legend = " ".join(t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text"))
    assert "node-1 GPU 3" in legend and "busy peers p10–p90 (n=7)" in legend and "peer median" in legend


def test_points_stay_inside_the_plot():
    root = parse(render(chart()))
    for css in ("gpu-line", "peer-band", "peer-median"):
        for _, x, y in coords(by_class(root, css)[0].get("d")):
            assert 0 <= x <= 760 and 0 <= y <= 240, (css, x, y)


def test_a_missing_value_or_a_hole_in_time_breaks_the_line():
    pts = [(T0 + i, 1900.0) for i in range(10)] + [(T0 + 10, None)] + [(T0 + i, 1900.0) for i in range(11, 20)]
    pts += [(T0 + i, 1900.0) for i in range(60, 70)]  # 40 s without samples
    d = by_class(parse(render(chart(gpu=pts))), "gpu-line")[0].get("d")
    assert [c for c, _, _ in coords(d)].count("M") == 3


def test_a_lone_point_is_a_dot():
    root = parse(render(chart(gpu=[(T0 + 10, 1500.0)], band=[])))
    assert root.findall(".//s:circle", NS)


def test_reason_bits_get_a_lane_each():
    spans = [Span("HW thermal slowdown", T0 + 50, T0 + 100), Span("SW thermal slowdown", T0 + 50, T0 + 70),
             Span("SW thermal slowdown", T0 + 80, T0 + 100)]
    root = parse(render(chart(spans=spans)))
    rects = by_class(root, "reason-span")
    assert [r.get("data-reason") for r in rects] == ["HW thermal slowdown", "SW thermal slowdown", "SW thermal slowdown"]
    assert len({r.get("y") for r in rects}) == 2  # one lane per bit
    assert all(float(r.get("width")) > 0 for r in rects)


def test_marks_inside_the_window_only():
    root = parse(render(chart(marks=[Mark(T0 + 50, "onset"), Mark(T0 - 500, "long ago"), Mark(T0 + 60, "detected")])))
    assert [g.get("data-mark") for g in by_class(root, "mark")] == ["onset", "detected"]


def test_text_is_escaped():
    svg = render(chart(title="<script>alert(1)</script>", unit="&", gpu_label='"><img src=x>', spans=[Span("<b>", T0, T0 + 5)]))
    assert "<script>" not in svg and "<img" not in svg and "<b>" not in svg
    parse(svg)  # still well-formed


def test_no_samples_says_so():
    root = parse(render(chart(gpu=[], band=[])))
    assert by_class(root, "no-data") and not by_class(root, "gpu-line")


def test_flat_or_all_none_series_do_not_break():
    parse(render(chart(gpu=[(T0 + i, 5.0) for i in range(10)], band=[])))
    parse(render(chart(gpu=[(T0 + i, None) for i in range(10)], band=[])))
    parse(render(chart(since=T0, until=T0)))  # an empty window


def test_nice_ticks():
    assert nice_ticks(0, 1980) == [0, 500, 1000, 1500, 2000]
    ticks = nice_ticks(61, 91)
    assert ticks[0] <= 61 and ticks[-1] >= 91 and len(ticks) <= 8
    assert nice_ticks(5, 5)[0] < 5 < nice_ticks(5, 5)[-1]
    assert nice_ticks(0.001, 0.004) == [0.001, 0.002, 0.003, 0.004]


def test_time_ticks_are_round_and_inside():
    ticks = time_ticks(T0 + 7, T0 + 307)
    assert ticks and all(T0 + 7 <= t <= T0 + 307 for t in ticks)
    step = ticks[1] - ticks[0]
    assert step in (60, 120) and all(t % step == 0 for t in ticks)
