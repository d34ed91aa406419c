"""The Alertmanager target against Debian's prometheus-alertmanager on a loopback port: the
collector posts to /api/v2/alerts, Alertmanager routes to a local webhook receiver, the alert
fires with Laggard's labels and resolves when the episode does (endsAt on resolve)."""

from __future__ import annotations

import json
import subprocess
import time

import httpx
import pytest

from server.alerts.payload import fingerprint
from server.alerts.settings import AlertSettings
from server.app import create_app
from server.detect.settings import DetectionSettings
from server.serve import start_in_thread
from server.settings import Settings
from tests.metrics.fleet import push_range
from tests.metrics.tools import Receiver, free_port, require_binary, wait_http

AM_CONFIG = """
route:
  receiver: local
  group_by: [alertname, cluster, cause]
  group_wait: 0s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: local
    webhook_configs:
      - url: {url}/am
        send_resolved: true
"""


@pytest.fixture
def alertmanager(tmp_path):
    binary = require_binary("prometheus-alertmanager")
    receiver = Receiver()
    port = free_port()
    config = tmp_path / "alertmanager.yml"
    config.write_text(AM_CONFIG.format(url=receiver.url))
    proc = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.path={tmp_path / 'am-data'}", f"--web.listen-address=127.0.0.1:{port}",
         "--cluster.listen-address=", "--log.level=warn"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/-/ready", proc=proc)
        yield f"http://127.0.0.1:{port}", receiver
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        receiver.close()


def test_alerts_reach_alertmanager_and_resolve(alertmanager, tmp_path, sqlite_url):
    am_url, receiver = alertmanager
    routes = tmp_path / "routes.yaml"
    routes.write_text(f"receivers:\n  - name: team-am\n    type: alertmanager\n    url: {am_url}\ndefault_receivers: [team-am]\n")
    settings = Settings(database_url=sqlite_url, detection=DetectionSettings(open_after_s=0, clear_after_s=0), detection_poll_s=0.05,
                        alerts=AlertSettings(routes_file=str(routes), group_wait_s=0.2, poll_s=0.05, alertmanager_resend_s=60))
    t0 = float(int(time.time()) - 60)
    server = start_in_thread(create_app(settings))
    try:
        push_range(server.url, t0, 0, 5)
        push_range(server.url, t0, 5, 10, hot={"n2": (3,)})
        docs = receiver.wait(lambda d: any(x["status"] == "firing" for x in d), timeout=30)
        firing = [d for d in docs if d["status"] == "firing"]
        assert firing, "Alertmanager never notified"
        (alert,) = firing[0]["alerts"]
        assert alert["labels"] == {"alertname": "LaggardStraggler", "cluster": "prod", "node": "n2", "gpu": "3", "cause": "thermal",
                                   "severity": "critical"}
        assert "1400 MHz" in alert["annotations"]["summary"]
        assert alert["startsAt"].startswith(time.strftime("%Y-%m-%dT", time.gmtime(t0 + 5)))
        # Alertmanager holds it active, with the endsAt Laggard gave (4 resend periods ahead).
        active = httpx.get(f"{am_url}/api/v2/alerts", timeout=10).json()
        assert [a["labels"]["node"] for a in active] == ["n2"] and active[0]["status"]["state"] == "active"
        # The fingerprint Laggard gives the same label set is Alertmanager's own (issue #16), so
        # downstream deduplication pairs a webhook's alert with the Alertmanager's.
        assert fingerprint(alert["labels"]) == alert["fingerprint"] == active[0]["fingerprint"]

        push_range(server.url, t0, 10, 18)  # cools down: the episode resolves, Laggard posts endsAt
        docs = receiver.wait(lambda d: any(x["status"] == "resolved" for x in d), timeout=30)
        resolved = [d for d in docs if d["status"] == "resolved"]
        assert resolved, [d["status"] for d in docs]
        assert resolved[0]["alerts"][0]["labels"]["gpu"] == "3"
        assert resolved[0]["alerts"][0]["endsAt"] != "0001-01-01T00:00:00Z"
        assert json.dumps(resolved[0]).count("LaggardStraggler") >= 1
    finally:
        server.stop()
