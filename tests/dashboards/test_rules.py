"""deploy/prometheus/laggard-alerts.yml: valid rules (`promtool check rules`), and they do what
their unit tests say (`promtool test rules`), which fail when an expectation is wrong."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.metrics.tools import require_binary

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([require_binary("promtool"), *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_rules_are_valid():
    proc = promtool("check", "rules", "laggard-alerts.yml", cwd=RULES)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 9 rules found" in proc.stdout


def test_rule_unit_tests_pass():
    proc = promtool("test", "rules", "laggard-alerts.test.yml", cwd=RULES)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_a_wrong_expectation_fails(tmp_path):
    shutil.copy(RULES / "laggard-alerts.yml", tmp_path)
    tests = (RULES / "laggard-alerts.test.yml").read_text()
    broken = tests.replace('summary: "XID 79 on n1 GPU 2 (prod)"', 'summary: "XID 79 on n9 GPU 2 (prod)"')
    assert broken != tests
    (tmp_path / "laggard-alerts.test.yml").write_text(broken)
    proc = promtool("test", "rules", "laggard-alerts.test.yml", cwd=tmp_path)
    assert proc.returncode != 0
    assert "FAILED" in proc.stdout + proc.stderr
