"""The hand-written text format (agent/exposition.py render) says exactly what prometheus_client
says for the same families: same samples, same types, same help, escaping included."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.exposition import Family, format_value, label_string, render
from server.metrics.collector import to_prometheus


def _parsed(text: str) -> dict:
    out = {}
    for fam in text_string_to_metric_families(text):
        out[fam.name] = (fam.type, fam.documentation, sorted((s.name, sorted(s.labels.items()), float(s.value)) for s in fam.samples))
    return out


def _reference(families: list[Family]) -> str:
    class Collector:
        def collect(self):
            for fam in families:
                yield to_prometheus(fam)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector())
    return generate_latest(registry).decode()


def awkward_families() -> list[Family]:
    gauge = Family("laggard_test_gauge", "gauge", 'Help with a backslash \\ and a\nnewline and "quotes".', ("node", "gpu"))
    gauge.add(('n"1', "0"), 1.5)
    gauge.add(("back\\slash\nnew", "1"), -2)
    gauge.add(("ünïcødé", "2"), 1e21)
    gauge.add(("big", "3"), 12345678901234567)
    gauge.add(("inf", "4"), math.inf)
    counter = Family("laggard_test_things_total", "counter", "Things.", ("kind",))
    counter.add(("a",), 3)
    counter.add(("b",), 0.0)
    untyped = Family("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "untyped", "Total number of PCIe retries.", ("gpu", "UUID"))
    untyped.add(("0", "GPU-1"), 7)
    bare = Family("laggard_test_unlabelled", "gauge", "No labels.")
    bare.add((), 42)
    hist = Family("laggard_test_duration_seconds", "histogram", "Durations.", ("code",))
    hist.add_histogram(("200",), [(0.1, 1), (1.0, 3), (math.inf, 4)], 2.5, 4)
    bare_hist = Family("laggard_test_other_seconds", "histogram", "Unlabelled durations.")
    bare_hist.add_histogram((), [(0.005, 0), (math.inf, 0)], 0.0, 0)
    empty = Family("laggard_test_empty", "gauge", "No samples yet.", ("x",))
    return [gauge, counter, untyped, bare, hist, bare_hist, empty]


def test_render_matches_prometheus_client():
    families = awkward_families()
    assert _parsed(render(families)) == _parsed(_reference(families))


def test_render_matches_prometheus_client_on_the_collectors_families(tmp_path):
    """The real families of a collector (the DCGM ones included)."""
    import time

    from server.app import create_app
    from server.detect.settings import DetectionSettings
    from server.serve import start_in_thread
    from server.settings import Settings
    from tests.metrics.fleet import push_range

    server = start_in_thread(create_app(Settings(database_url=f"sqlite:///{tmp_path / 'l.db'}", detection=DetectionSettings(open_after_s=0))))
    try:
        push_range(server.url, float(int(time.time()) - 10), 0, 3, xid={"n1": 1})
        families = server.server.config.app.state.services.metrics.collector.families()
    finally:
        server.stop()
    assert sum(len(f.rows) for f in families) > 400
    assert _parsed(render(families)) == _parsed(_reference(families))


def test_values_and_labels():
    assert format_value(3) == "3"
    assert format_value(2.5) == "2.5"
    assert format_value(float("nan")) == "NaN"
    assert format_value(-math.inf) == "-Inf"
    assert label_string(("a", "b"), ("x", 'y"\n\\')) == '{a="x",b="y\\"\\n\\\\"}'
    assert label_string((), ()) == ""


def test_families_reject_misnamed_counters():
    with pytest.raises(ValueError):
        Family("laggard_things", "counter", "No _total.")
    with pytest.raises(ValueError):
        Family("laggard_things", "summary", "Unsupported type.")
