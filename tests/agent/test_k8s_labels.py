"""agent/k8s_labels.py: the agent DaemonSet's initContainer that turns node labels into
LAGGARD_LABELS, against a local stand-in for the Kubernetes API server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agent.cli import parse_config
from agent.k8s_labels import parse_map, pick_labels
from tests.hints.fake_apiserver import FakeApiServer, node

REPO = Path(__file__).resolve().parents[2]
NODE_LABELS = {"kubernetes.io/hostname": "gpu-1", "cloud.google.com/gke-nodepool": "h100-a", "example.com/rack": "r12"}


def run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    token = tmp_path / "token"
    token.write_text("t0k3n\n")
    return subprocess.run([sys.executable, "-m", "agent.k8s_labels", "--token-file", str(token), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=60)


def test_parse_map():
    assert parse_map("partition=cloud.google.com/gke-nodepool, example.com/rack ,") == {
        "partition": "cloud.google.com/gke-nodepool", "example.com/rack": "example.com/rack"}
    with pytest.raises(ValueError, match="expected LABEL=NODE_LABEL"):
        parse_map("partition=")


def test_pick_labels_leaves_out_what_the_node_lacks():
    assert pick_labels(NODE_LABELS, {"rack": "example.com/rack", "zone": "topology.kubernetes.io/zone"}) == {"rack": "r12"}


def test_writes_the_line_the_agent_reads_as_LAGGARD_LABELS(tmp_path):
    out = tmp_path / "labels"
    with FakeApiServer([node("gpu-1", labels=NODE_LABELS)]) as api:
        done = run(["--api-server", api.url, "--node", "gpu-1", "--output", str(out),
                    "--map", "partition=cloud.google.com/gke-nodepool,rack=example.com/rack,zone=topology.kubernetes.io/zone"], tmp_path)
        assert done.returncode == 0, done.stderr
        assert [r["path"] for r in api.requests] == ["/api/v1/nodes/gpu-1"]
    line = out.read_text().strip()
    assert line == "partition=h100-a,rack=r12"
    assert "topology.kubernetes.io/zone" in done.stderr  # the missing one is logged
    assert parse_config([], env={"LAGGARD_LABELS": line}).labels == {"partition": "h100-a", "rack": "r12"}


def test_an_unknown_node_fails_with_the_api_servers_reason(tmp_path):
    with FakeApiServer([]) as api:
        done = run(["--api-server", api.url, "--node", "gpu-9", "--output", str(tmp_path / "labels"), "--map", "rack"], tmp_path)
    assert done.returncode == 1
    assert "HTTP 404" in done.stderr and 'nodes \\"gpu-9\\" not found' in done.stderr
    assert not (tmp_path / "labels").exists()


def test_no_map_writes_an_empty_line_without_asking_the_api(tmp_path):
    out = tmp_path / "labels"
    done = run(["--api-server", "http://127.0.0.1:9", "--node", "gpu-1", "--output", str(out)], tmp_path)
    assert done.returncode == 0, done.stderr
    assert out.read_text() == "\n"
