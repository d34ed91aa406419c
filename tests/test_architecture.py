"""The import graph against the never-rules of docs/architecture.md.

Every import of every module of agent/ and server/ counts, those inside functions too: a
lazy import is still a dependency."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

OUTPUTS = ("server.alerts", "server.hints", "server.metrics")
DETECTOR = "server.detect"
RULES = "server.detect.rules"
API = "server.api"
STORAGE = "server.store"
# What storage may build on: the protocol and the shared vocabulary, nothing that uses storage.
BELOW_STORAGE = ("server.protocol", "server.peer_groups", "server.errors")


def _within(module: str, part: str) -> bool:
    return module == part or module.startswith(part + ".")


def _is_router(module: str) -> bool:
    """A module the app mounts: anything of the API, or a domain's router.py / *_router.py."""
    return _within(module, API) or module.rsplit(".", 1)[-1].endswith("router")


def _domain(module: str) -> str:
    """The package a router belongs to (server.api for the whole API)."""
    return API if _within(module, API) else module.rsplit(".", 1)[0]


def _mounts_router(source: str, target: str) -> bool:
    """`source` importing the router `target` is not the app, nor a router of the same domain."""
    if not _is_router(target) or source == "server.app":
        return False
    return not (_is_router(source) and _domain(source) == _domain(target))


def _forbidden(source: str, target: str) -> str | None:
    """The never-rule `source` importing `target` breaks, if any."""
    if _within(source, "agent") and _within(target, "server"):
        return "the agent never imports the server (it ships alone)"
    if _within(source, RULES) and any(_within(target, t) for t in (STORAGE, API, "sqlalchemy", "fastapi")):
        return "rules never import storage or the API: they are pure functions over windows"
    for output in OUTPUTS:
        if _within(source, output):
            others = [o for o in OUTPUTS if o != output]
            if any(_within(target, t) for t in (*others, DETECTOR, API)):
                return "an output never imports another output, the detector or the API: it reads storage"
    if _within(source, DETECTOR) and any(_within(target, t) for t in (*OUTPUTS, API)):
        return "the detector never imports an output or the API: it writes episodes and their events"
    if _within(source, STORAGE) and _within(target, "server") and not any(_within(target, t) for t in (STORAGE, *BELOW_STORAGE)):
        return "storage imports nothing that uses it"
    if _mounts_router(source, target):
        return "only the app mounts the API"
    return None


def violations(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for source, targets in sorted(graph.items()):
        for target in sorted(targets):
            why = _forbidden(source, target)
            if why is not None:
                found.append(f"{source} imports {target}: {why}")
    return found


def import_graph(*packages: str) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            module = ".".join(parts)
            targets = graph.setdefault(module, set())
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    targets.add(node.module)
                    targets.update(f"{node.module}.{alias.name}" for alias in node.names)
                elif isinstance(node, ast.Import):
                    targets.update(alias.name for alias in node.names)
    return graph


def test_the_code_keeps_the_never_rules():
    graph = import_graph("agent", "server")
    assert "server.detect.engine" in graph and "agent.cli" in graph  # the walk found the code
    assert violations(graph) == []


@pytest.mark.parametrize("source, target, broken", [
    ("agent.push", "server.protocol", True),
    ("agent.push", "agent.sample", False),
    ("server.detect.rules.network", "server.store.schema", True),
    ("server.detect.rules.network", "sqlalchemy", True),
    ("server.detect.rules.network", "server.detect.model", False),
    ("server.detect.shard", "server.alerts.outbox", True),
    ("server.detect.shard", "server.store.episode_events", False),
    ("server.metrics.collector", "server.detect.observe", True),
    ("server.metrics.collector", "server.hints.service", True),
    ("server.metrics.runtime", "server.hints.router", True),
    ("server.metrics.collector", "server.peer_groups", False),
    ("server.alerts.dispatcher", "server.metrics.counters", True),
    ("server.alerts.dispatcher", "server.store.counters", False),
    ("server.hints.k8s_sync", "server.hints.render", False),
    ("server.store.retention", "server.hints.held", True),
    ("server.store.samples", "server.protocol", False),
    ("server.hints.cli", "server.api.hints", True),
    ("server.app", "server.hints.router", False),
    ("server.app", "server.api.gpus", False),
    ("server.app", "server.ingest.router", False),
    ("server.ingest.decode", "server.ingest.router", True),
    ("server.hints.cli", "server.hints.router", True),
    ("server.hints.extender_router", "server.hints.router", False),
    ("server.hints.router", "server.auth.router", True),
    ("server.api.gpus", "server.api.deps", False),
    ("server.ui.router", "server.api.deps", True),
    ("server.store.samples", "server.ingest.protocol_decoder", True),
])
def test_each_never_rule_is_caught(source, target, broken):
    assert bool(violations({source: {target}})) is broken
