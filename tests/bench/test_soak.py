"""bench/soak.py, shortened: the harness that produces docs/reliability.md's soak figures runs a
real collector with authentication on and a simulated fleet, checks every acknowledged sample is
stored, and reports its bounds (the ten-minute run itself is a benchmark, not a test)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# A 12 s soak of a real collector and fleet, with its start and stop: half a minute.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def test_a_short_soak_holds_its_bounds_and_loses_nothing(tmp_path):
    out = tmp_path / "soak.json"
    done = subprocess.run([sys.executable, "bench/soak.py", "--duration", "12", "--nodes", "4", "--json", str(out),
                           "--max-p99-ms", "2000", "--max-minute-p99-ms", "4000"], cwd=REPO, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads(out.read_text())["summary"]
    assert summary["acked_samples"] > 0 and summary["stored_gpu_samples"] >= summary["acked_gpu_samples"]
    assert summary["probe_requests"] > 0 and summary["probe_non_200"] == 0
    assert summary["collector_errors_in_log"] == 0 and summary["collector_exit_code"] == 0
