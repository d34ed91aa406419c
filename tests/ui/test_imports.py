"""Where the status page sits in the import graph (docs/ui.md): like the API, it reads storage,
the shared vocabulary and the hints (through the cache the app made, and their pure text
builders); it never imports the API, the detector, the alerts or the metrics, and only the app
mounts it."""

from __future__ import annotations

from tests.test_architecture import import_graph

NEVER = ("server.api", "server.detect", "server.alerts", "server.metrics", "agent")


def _within(module: str, part: str) -> bool:
    return module == part or module.startswith(part + ".")


def test_the_page_imports_no_other_reader_and_only_the_app_imports_it():
    graph = import_graph("agent", "server")
    assert "server.ui.router" in graph and "server.ui.chart" in graph
    broken = [f"{s} imports {t}" for s, ts in graph.items() if _within(s, "server.ui") for t in ts if any(_within(t, n) for n in NEVER)]
    assert broken == []
    users = {s for s, ts in graph.items() if not _within(s, "server.ui") for t in ts if _within(t, "server.ui")}
    assert users <= {"server.app"}, users


def test_the_chart_and_view_models_are_pure():
    graph = import_graph("server")
    for module in ("server.ui.chart", "server.ui.series", "server.ui.views"):
        impure = [t for t in graph[module] if any(_within(t, x) for x in ("sqlalchemy", "fastapi", "starlette", "server.store"))]
        assert impure == [], (module, impure)
