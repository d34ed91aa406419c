"""Alert shapes: Alertmanager's webhook payload (version 4), its alert fields, the fingerprint,
the signature, Alertmanager's postable alerts."""

from __future__ import annotations

import json

from server.alerts import signing
from server.alerts.payload import (
    ZERO_TIME,
    alert_for_episode,
    episode_labels,
    fingerprint,
    generator_url,
    notification,
    parse_rfc3339,
    postable,
    rfc3339,
)

EP = {
    "id": 7, "cluster": "prod", "node": "n2", "gpu": 3, "uuid": "GPU-n2-3", "entity": "gpu:GPU-n2-3", "cause": "thermal",
    "severity": "critical", "onset": 1_700_000_000.25, "detected_at": 1_700_000_002.0, "resolved_at": None,
    "evidence": {"sm_clock_mhz": 1400, "peer_median": 1976.0}, "summary": "GPU 3 SM clock 1400 MHz vs peer median 1976 MHz",
}


def test_alert_fields():
    a = alert_for_episode(EP, status="firing")
    assert a["labels"] == {"alertname": "LaggardStraggler", "cluster": "prod", "node": "n2", "gpu": "3", "cause": "thermal",
                           "severity": "critical"}
    assert a["annotations"]["summary"] == EP["summary"]
    assert json.loads(a["annotations"]["evidence"]) == EP["evidence"]
    assert a["startsAt"] == "2023-11-14T22:13:20.250Z" and parse_rfc3339(a["startsAt"]) == EP["onset"]
    assert a["endsAt"] == ZERO_TIME and a["status"] == "firing"
    resolved = alert_for_episode(EP | {"resolved_at": 1_700_000_100.0}, status="resolved", ends_at=1_700_000_100.0)
    assert resolved["fingerprint"] == a["fingerprint"]  # receivers pair the resolve with its firing
    assert resolved["endsAt"] == rfc3339(1_700_000_100.0)


def test_fingerprint_is_the_label_set():
    labels = episode_labels(EP)
    assert fingerprint(labels) == fingerprint(dict(reversed(list(labels.items()))))
    assert fingerprint(labels) == "%s" % fingerprint(dict(labels))  # stable across calls and processes (no hash seed)
    assert fingerprint(labels | {"gpu": "4"}) != fingerprint(labels)
    assert fingerprint(labels | {"severity": "warning"}) != fingerprint(labels)
    assert len(fingerprint(labels)) == 16
    # Prometheus' empty label set hashes to FNV-1a's offset basis; real values are checked against
    # a real Alertmanager in tests/alerts/test_alertmanager.py.
    assert fingerprint({}) == "cbf29ce484222325"


def test_an_episode_of_an_attributed_gpu_names_its_job_as_the_rules_alerts_do():
    labels = episode_labels(EP | {"evidence": EP["evidence"] | {"job": "llm-finetune"}})
    assert labels["job_name"] == "llm-finetune"
    assert "job_name" not in episode_labels(EP) and "job" not in labels


def test_port_episodes_carry_device_and_port():
    nic = EP | {"gpu": None, "uuid": None, "entity": "nic:prod/rack/1/n2/mlx5_2/1", "cause": "network"}
    labels = episode_labels(nic)
    assert labels["device"] == "mlx5_2" and labels["port"] == "1" and "gpu" not in labels
    other = episode_labels(nic | {"entity": "nic:prod/rack/1/n2/mlx5_3/1"})
    assert fingerprint(labels) != fingerprint(other)


def test_webhook_payload_version_4():
    a = alert_for_episode(EP, status="firing")
    b = alert_for_episode(EP | {"id": 8, "gpu": 5, "uuid": "GPU-n2-5", "summary": "GPU 5 ..."}, status="firing")
    doc = notification([a, b], receiver="oncall", external_url="http://laggard:8080")
    assert doc["version"] == "4" and doc["status"] == "firing" and doc["receiver"] == "oncall"
    assert doc["groupLabels"] == {"cluster": "prod", "cause": "thermal"}
    assert doc["commonLabels"] == {"alertname": "LaggardStraggler", "cluster": "prod", "node": "n2", "cause": "thermal",
                                   "severity": "critical"}
    assert "summary" not in doc["commonAnnotations"]
    assert doc["externalURL"] == "http://laggard:8080"
    assert doc["groupKey"] == '{}:{cause="thermal", cluster="prod"}' and doc["truncatedAlerts"] == 0
    for item in doc["alerts"]:
        assert set(item) == {"status", "labels", "annotations", "startsAt", "endsAt", "generatorURL", "fingerprint"}
        # The episode's own page on the collector's status page (issue #18).
        assert item["generatorURL"] == f"http://laggard:8080/ui/episodes/{item['annotations']['episode_id']}"
    resolved = alert_for_episode(EP, status="resolved", ends_at=EP["onset"] + 60)
    assert notification([resolved], receiver="r", external_url="x")["status"] == "resolved"
    assert notification([resolved, b], receiver="r", external_url="x")["status"] == "firing"


def test_generator_url_to_grafana():
    a = alert_for_episode(EP, status="firing")
    url = generator_url(a, external_url="http://laggard", dashboard_url="https://grafana.example/")
    assert url == "https://grafana.example/d/laggard-straggler/laggard-straggler-detail?var-cluster=prod&var-node=n2&var-gpu=3"


def test_alertmanager_postable():
    firing = postable(alert_for_episode(EP, status="firing"), external_url="http://l", ends_at=1_700_000_400.0)
    assert firing["endsAt"] == rfc3339(1_700_000_400.0) and firing["startsAt"] == rfc3339(EP["onset"])
    assert set(firing) == {"labels", "annotations", "startsAt", "endsAt", "generatorURL"}
    resolved = postable(alert_for_episode(EP, status="resolved", ends_at=1_700_000_100.0), external_url="http://l", ends_at=1e10)
    assert resolved["endsAt"] == rfc3339(1_700_000_100.0)


def test_signature():
    body = b'{"version":"4"}'
    header = signing.sign(body, "s3cret")
    assert header.startswith("sha256=") and len(header) == 7 + 64
    assert header == "sha256=" + __import__("hmac").new(b"s3cret", body, "sha256").hexdigest()
    assert signing.verify(body, header, "s3cret")
    assert not signing.verify(body + b" ", header, "s3cret")
    assert not signing.verify(body, header, "other")
    assert not signing.verify(body, None, "s3cret")
