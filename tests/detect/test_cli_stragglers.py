"""`laggard stragglers` against a running collector: the table a person reads, and JSON."""

from __future__ import annotations

import json

import pytest

from server.app import create_app
from server.cli.main import main
from server.detect.settings import DetectionSettings
from server.serve import start_in_thread
from server.settings import Settings
from tests.detect.test_service import push_instants, wait_for


@pytest.fixture
def running(sqlite_url):
    settings = Settings(database_url=sqlite_url, detection=DetectionSettings(open_after_s=0, clear_after_s=0), detection_poll_s=0.05)
    server = start_in_thread(create_app(settings))
    push_instants(server.url, 0, 5, hot=False)
    push_instants(server.url, 5, 9, hot=True)
    wait_for(server.url, lambda s: len(s) == 1)
    yield server
    server.stop()


def test_table_lists_the_active_straggler(running, capsys):
    assert main(["stragglers", "--server", running.url]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["ID", "CLUSTER", "NODE", "GPU", "CAUSE", "SEVERITY", "SINCE", "SUMMARY"]
    assert out[1].split()[1:6] == ["prod", "n2", "3", "thermal", "critical"]
    assert "1400 MHz" in out[1]


def test_json_and_filters(running, capsys):
    assert main(["stragglers", "--server", running.url, "-o", "json"]) == 0
    assert [s["cause"] for s in json.loads(capsys.readouterr().out)["stragglers"]] == ["thermal"]
    assert main(["stragglers", "--server", running.url, "--node", "n1"]) == 0
    assert capsys.readouterr().out.strip() == "no active stragglers"


def test_unreachable_server_is_a_clear_error(capsys):
    assert main(["stragglers", "--server", "http://127.0.0.1:9"]) == 1
    assert "cannot reach http://127.0.0.1:9" in capsys.readouterr().err
