"""`laggard demo` prints the status page's URL first."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

from server.demo import _print_banner, job_layout


def test_the_demo_banner_starts_with_the_page(capsys):
    server = SimpleNamespace(url="http://127.0.0.1:8080")
    nodes = [SimpleNamespace(name=f"gpu-node-{i:03d}") for i in range(16)]
    _print_banner(server, nodes, argparse.Namespace(gpus=8, model="H100", interval=1.0), job_layout(len(nodes)))
    first = next(line for line in capsys.readouterr().out.splitlines() if line.strip())
    assert first == "Laggard demo: status page at http://127.0.0.1:8080/ui"
