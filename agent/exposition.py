"""The Prometheus text exposition format (version 0.0.4), written by hand.

The agent ships alone with nvidia-ml-py and httpx only (no prometheus_client), and the
collector's GET /metrics (server/metrics) needs a faster writer than prometheus_client's for
10,000 GPUs: Family (a metric family kept as columns) and render() serve both."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable, Sequence

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


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
