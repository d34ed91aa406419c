"""Receivers from LAGGARD_WEBHOOK_URLS and the routes file; routing by cluster, cause, severity."""

from __future__ import annotations

import json

import pytest

from server.alerts.routing import RoutingError, load_routing, routing_from_settings
from server.settings import Settings

ROUTES = """
receivers:
  - name: oncall
    url: https://pager.example.com/hooks/laggard?token=abc
    secret_env: ONCALL_SECRET
  - name: net
    url: http://net.example.com/hook
  - name: am
    type: alertmanager
    url: http://alertmanager:9093
    headers: {Authorization: Bearer xyz}
routes:
  - match: {cluster: prod, severity: critical}
    receivers: [oncall]
    continue: true
  - match: {cause: [network, nvlink]}
    match_re: {node: "ib-.*"}
    receivers: [net]
default_receivers: [am]
"""


def labels(**kw):
    return {"alertname": "LaggardStraggler", "cluster": "prod", "node": "n1", "cause": "thermal", "severity": "warning"} | kw


def names(routing, **kw):
    return [r.name for r in routing.receivers_for(labels(**kw))]


@pytest.fixture
def routes_file(tmp_path):
    path = tmp_path / "routes.yaml"
    path.write_text(ROUTES)
    return str(path)


def test_env_receivers_get_everything():
    routing = load_routing(webhook_urls=" http://a.example/h1 , https://b.example/h2 ", webhook_secret="k")
    assert names(routing) == ["webhook-1", "webhook-2"]
    assert routing.receivers["webhook-1"].secret == "k"


def test_routes(routes_file):
    routing = load_routing(webhook_urls="http://all.example/h", webhook_secret="global", routes_file=routes_file,
                           environ={"ONCALL_SECRET": "pager-key"})
    assert names(routing) == ["webhook-1", "am"]  # nothing matched: defaults
    assert names(routing, severity="critical") == ["webhook-1", "oncall"]  # a route matched: no defaults
    assert names(routing, severity="critical", cause="network", node="ib-7") == ["webhook-1", "oncall", "net"]
    assert names(routing, cause="nvlink", node="ib-3") == ["webhook-1", "net"]
    assert names(routing, cause="nvlink", node="gpu-3") == ["webhook-1", "am"]  # match_re must match in full
    assert names(routing, cluster="staging", severity="critical") == ["webhook-1", "am"]
    assert routing.receivers["oncall"].secret == "pager-key"
    assert routing.receivers["net"].secret == "global"  # no own secret: LAGGARD_WEBHOOK_SECRET
    assert [r.name for r in routing.alertmanagers()] == ["am"]


def test_secrets_stay_out_of_repr(routes_file):
    routing = load_routing(routes_file=routes_file, environ={"ONCALL_SECRET": "pager-key"})
    text = repr(routing)
    for secret in ("pager-key", "token=abc", "Bearer xyz", "hooks/laggard"):
        assert secret not in text
    assert routing.receivers["oncall"].safe_url == "https://pager.example.com"


@pytest.mark.parametrize("doc, message", [
    ({"receivers": [{"name": "a", "url": "ftp://x"}]}, "http"),
    ({"receivers": [{"name": "a", "url": "http://x"}], "routes": [{"receivers": ["b"]}]}, "unknown receiver 'b'"),
    ({"receivers": [{"name": "a", "url": "http://x"}], "default_receivers": ["zz"]}, "unknown receiver 'zz'"),
    ({"receivers": [{"name": "a", "url": "http://x", "secret": "s", "secret_env": "E"}]}, "at most one"),
    ({"receivers": [{"name": "a", "url": "http://x", "secret_env": "NOPE_NOT_SET"}]}, "NOPE_NOT_SET is not set"),
    ({"receivers": [{"name": "a", "url": "http://x"}, {"name": "a", "url": "http://y"}]}, "used twice"),
    ({"recievers": []}, "recievers"),
    ({"receivers": [{"name": "a", "url": "http://x"}], "routes": [{"match_re": {"node": "("}, "receivers": ["a"]}]}, "match_re"),
])
def test_bad_files_are_refused_with_the_reason(tmp_path, doc, message):
    path = tmp_path / "routes.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(RoutingError, match=message.replace("(", r"\(")):
        load_routing(routes_file=str(path), environ={})


def test_bad_webhook_url_and_missing_file(tmp_path):
    with pytest.raises(RoutingError, match="LAGGARD_WEBHOOK_URLS item 2"):
        load_routing(webhook_urls="http://ok.example,not-a-url")
    with pytest.raises(RoutingError, match="cannot read"):
        load_routing(routes_file=str(tmp_path / "missing.yaml"))


def test_from_environment(monkeypatch, routes_file):
    monkeypatch.setenv("LAGGARD_WEBHOOK_URLS", "http://a.example/1,http://b.example/2")
    monkeypatch.setenv("LAGGARD_WEBHOOK_SECRET", "env-secret")
    monkeypatch.setenv("LAGGARD_ALERTS__ROUTES_FILE", routes_file)
    monkeypatch.setenv("ONCALL_SECRET", "x")
    settings = Settings()
    assert "env-secret" not in repr(settings)
    routing = routing_from_settings(settings.alerts)
    assert routing.everywhere == ("webhook-1", "webhook-2")
    assert routing.receivers["webhook-2"].secret == "env-secret"
    assert set(routing.names()) == {"webhook-1", "webhook-2", "oncall", "net", "am"}
