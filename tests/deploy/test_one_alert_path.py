"""One alert path (issue #16): every deployment in deploy/ pages a straggler episode once.

Two paths can page for one episode:
- the rules: LaggardStragglerCritical and LaggardStragglerWarning (deploy/prometheus/laggard-alerts.yml,
  PrometheusRule `laggard`), from Prometheus through an Alertmanager;
- the collector's own push (server/alerts: LAGGARD_WEBHOOK_URLS, the routes file
  LAGGARD_ALERTS__ROUTES_FILE), alertname LaggardStraggler, to webhooks or an Alertmanager.

Where deploy/ brings Prometheus the rules are the default and the collector pushes nothing; the
push is the opt-in for sites without Prometheus, and whoever turns it on also turns the two
rules off (docs/observability.md, "One alert path"). For each deployment this reads what it
runs - Compose through `docker compose config` and the files it mounts, Kubernetes through
`kubectl kustomize` - and counts the paths that page:

- the rules page where the deployment's Prometheus loads a rule named LaggardStragglerCritical or
  LaggardStragglerWarning and sends to an Alertmanager (on Kubernetes: a PrometheusRule with
  them; the site's Alertmanager is not in deploy/), unless that Alertmanager (amtool's own
  routing) sends them to a receiver that notifies nobody and is not its root receiver, the one
  a site turns into its pager;
- the collector pages where its settings (the real Settings and routing) give any receiver to one
  of its straggler alerts (every cause, both severities, a GPU and an IB-port episode); one
  that is the Compose Alertmanager pages unless routed there like the rules above.
"""

from __future__ import annotations

import base64
import importlib
import os
import pkgutil
import posixpath
import re
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml

import server.detect.rules
from server.alerts.payload import episode_labels
from server.alerts.routing import routing_from_settings
from tests.deploy.test_compose import bind_mounts, resolved
from tests.deploy.test_kubernetes import K8S_VERSIONS, KUBE, PROMETHEUS_OPERATOR, one, operator_schema, render
from tests.deploy.tools import REPO, require_tool

STRAGGLER_RULES = frozenset({"LaggardStragglerCritical", "LaggardStragglerWarning"})
# What the collector's own push pages for, so the direct-alerts component takes out of the rules:
# the straggler rules and the XID rule (an xid episode is the same event).
COLLECTOR_PAGES = STRAGGLER_RULES | {"LaggardHardwareXid"}
DIRECT_ALERTS = KUBE / "components" / "direct-alerts"


def causes() -> list[str]:
    found = []
    for info in pkgutil.iter_modules(server.detect.rules.__path__):
        cause = getattr(importlib.import_module(f"server.detect.rules.{info.name}"), "CAUSE", None)
        if cause:
            found.append(cause)
    assert "thermal" in found and "network" in found
    return sorted(found)


def collector_alerts() -> list[dict[str, str]]:
    """The labels of the collector's straggler alerts: every cause and severity, GPU and IB port."""
    out = []
    for cause in causes():
        for severity in ("warning", "critical"):
            episode = {"cluster": "prod", "node": "n1", "gpu": 3, "cause": cause, "severity": severity}
            out.append(episode_labels(episode))
            out.append(episode_labels({**episode, "gpu": None, "entity": "nic:prod/n1/mlx5_0/1"}))
    return out


def rule_alerts() -> list[dict[str, str]]:
    """The labels of the two straggler rules' alerts (their `by` labels and severity)."""
    return [{"alertname": name, "cluster": "prod", "node": "n1", "gpu": "3", "cause": cause,
             "severity": "critical" if name.endswith("Critical") else "warning"}
            for name in sorted(STRAGGLER_RULES) for cause in causes()]


def alert_names(groups: list[dict]) -> set[str]:
    return {rule["alert"] for group in groups for rule in group.get("rules", []) if "alert" in rule}


class Alertmanager:
    """An Alertmanager configuration, asked where a label set goes with `amtool config routes test`."""

    def __init__(self, config: Path):
        self.config = config
        self.doc = yaml.safe_load(config.read_text())
        self.amtool = require_tool("amtool", "Debian package prometheus-alertmanager; .ci/run installs it")

    def receivers(self, labels: dict[str, str]) -> list[str]:
        proc = subprocess.run([self.amtool, "config", "routes", "test", f"--config.file={self.config}",
                               *(f"{k}={v}" for k, v in sorted(labels.items()))], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return [name.strip() for name in proc.stdout.strip().split(",") if name.strip()]

    def silent(self, name: str) -> bool:
        """A receiver that notifies nobody (no integrations), other than the root receiver."""
        (receiver,) = [r for r in self.doc["receivers"] if r["name"] == name]
        return name != self.doc["route"]["receiver"] and not any(key.endswith("_configs") for key in receiver)

    def pages(self, labels: dict[str, str]) -> bool:
        return not all(self.silent(name) for name in self.receivers(labels))


def collector_routing(env: dict[str, str], monkeypatch):
    """The collector's alert receivers under these LAGGARD_* variables, or None with alerts off."""
    from server.settings import Settings

    with monkeypatch.context() as m:
        for key in list(os.environ):
            if key.startswith("LAGGARD_"):
                m.delenv(key)
        for key, value in env.items():
            m.setenv(key, value)
        settings = Settings()
        return routing_from_settings(settings.alerts) if settings.alerts.enabled else None


# --- Docker Compose ---------------------------------------------------------------------------


def compose_paths(monkeypatch, *, routes_file: Path | None = None, alertmanager_file: Path | None = None) -> set[str]:
    """The paths that page in docker-compose.yml; the two files may be replaced by edited copies."""
    services = resolved()["services"]
    prometheus_mounts = bind_mounts(services["prometheus"])
    prometheus_config = yaml.safe_load(Path(prometheus_mounts["/etc/prometheus/prometheus.yml"]).read_text())
    rules: set[str] = set()
    for rule_file in prometheus_config.get("rule_files", []):
        in_container = posixpath.normpath(posixpath.join("/etc/prometheus", rule_file))
        rules |= alert_names(yaml.safe_load(Path(prometheus_mounts[in_container]).read_text())["groups"])
    targets = {urlsplit(f"//{t}").hostname for am in prometheus_config.get("alerting", {}).get("alertmanagers", [])
               for sc in am.get("static_configs", []) for t in sc.get("targets", [])}
    (am_service,) = targets & set(services)  # Prometheus sends to the Compose Alertmanager
    alertmanager = Alertmanager(alertmanager_file or Path(bind_mounts(services[am_service])["/etc/alertmanager/alertmanager.yml"]))

    paths = set()
    if rules & STRAGGLER_RULES and any(alertmanager.pages(labels) for labels in rule_alerts() if labels["alertname"] in rules):
        paths.add("rules")

    collector = services["collector"]
    env = {k: str(v) for k, v in collector.get("environment", {}).items()}
    if "LAGGARD_ALERTS__ROUTES_FILE" in env:
        env["LAGGARD_ALERTS__ROUTES_FILE"] = str(routes_file or bind_mounts(collector)[env["LAGGARD_ALERTS__ROUTES_FILE"]])
    routing = collector_routing(env, monkeypatch)
    for labels in collector_alerts() if routing else ():
        for receiver in routing.receivers_for(labels):
            to_compose_alertmanager = receiver.type == "alertmanager" and urlsplit(receiver.url).hostname == am_service
            if not to_compose_alertmanager or alertmanager.pages(labels):
                paths.add("collector")
    return paths


def test_compose_pages_once_through_the_rules(monkeypatch):
    assert compose_paths(monkeypatch) == {"rules"}


def uncomment_opt_in(text: str) -> str:
    """What a user does to deploy/compose/alertmanager.yml: uncomment the indented lines marked
    "opt-in" and the commented lines that continue them (indented deeper after the #)."""
    out, in_block = [], False
    for line in text.splitlines():
        m = re.match(r"^( +)# (.*)$", line)
        if m and ("opt-in" in m[2] or (in_block and m[2].startswith(" "))):
            out.append(m[1] + m[2])
            in_block = True
        else:
            out.append(line)
            in_block = False
    return "\n".join(out) + "\n"


def switched_to_the_collector(tmp_path: Path, *, silence_rules: bool) -> dict[str, Path]:
    """The Compose opt-in as deploy/compose/alert-routes.yaml describes it: its default_receivers
    names the Compose Alertmanager, and the route marked opt-in in alertmanager.yml is uncommented."""
    services = resolved()["services"]
    routes_file = Path(bind_mounts(services["collector"])[services["collector"]["environment"]["LAGGARD_ALERTS__ROUTES_FILE"]])
    routes = yaml.safe_load(routes_file.read_text())
    routes["default_receivers"] = ["compose-alertmanager"]
    (tmp_path / "alert-routes.yaml").write_text(yaml.safe_dump(routes))
    config = Path(bind_mounts(services["alertmanager"])["/etc/alertmanager/alertmanager.yml"]).read_text()
    (tmp_path / "alertmanager.yml").write_text(uncomment_opt_in(config) if silence_rules else config)
    return {"routes_file": tmp_path / "alert-routes.yaml", "alertmanager_file": tmp_path / "alertmanager.yml"}


def test_compose_opt_in_pages_once_through_the_collector(monkeypatch, tmp_path):
    files = switched_to_the_collector(tmp_path, silence_rules=True)
    amtool = require_tool("amtool", "Debian package prometheus-alertmanager; .ci/run installs it")
    proc = subprocess.run([amtool, "check-config", str(files["alertmanager_file"])], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert compose_paths(monkeypatch, **files) == {"collector"}


def test_the_collector_push_alone_would_page_twice(monkeypatch, tmp_path):
    """What the check catches: turning the push on without turning the rules off."""
    assert compose_paths(monkeypatch, **switched_to_the_collector(tmp_path, silence_rules=False)) == {"rules", "collector"}


# --- Kubernetes -------------------------------------------------------------------------------


def data_of(obj: dict) -> dict[str, str]:
    """A ConfigMap's or Secret's keys as text."""
    out = {k: base64.b64decode(v).decode() for k, v in obj.get("data", {}).items()} if obj["kind"] == "Secret" else dict(obj.get("data", {}))
    return out | obj.get("stringData", {})


def collector_env(objects, tmp_path: Path) -> dict[str, str] | None:
    """The collector container's LAGGARD_* environment, with the files it mounts from Secrets and
    ConfigMaps written under tmp_path and paths to them put in place of the mount paths."""
    deployments = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "laggard-collector"]
    if not deployments:
        return None
    pod = deployments[0]["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "collector"]
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        kind, ref = ("ConfigMap", source["configMapRef"]) if "configMapRef" in source else ("Secret", source["secretRef"])
        env |= {source.get("prefix", "") + k: v for k, v in data_of(one(objects, kind, ref["name"])).items()}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        elif "secretKeyRef" in item.get("valueFrom", {}):
            ref = item["valueFrom"]["secretKeyRef"]
            env[item["name"]] = data_of(one(objects, "Secret", ref["name"]))[ref["key"]]
        elif "configMapKeyRef" in item.get("valueFrom", {}):
            ref = item["valueFrom"]["configMapKeyRef"]
            env[item["name"]] = data_of(one(objects, "ConfigMap", ref["name"]))[ref["key"]]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    files: dict[str, Path] = {}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if "secret" in volume:
            data = data_of(one(objects, "Secret", volume["secret"]["secretName"]))
            items = volume["secret"].get("items")
        elif "configMap" in volume:
            data = data_of(one(objects, "ConfigMap", volume["configMap"]["name"]))
            items = volume["configMap"].get("items")
        else:
            continue
        for key, path in ((i["key"], i["path"]) for i in items) if items else ((k, k) for k in data):
            host = tmp_path / mount["name"] / path
            host.parent.mkdir(parents=True, exist_ok=True)
            host.write_text(data[key])
            files[posixpath.join(mount["mountPath"], path)] = host
    if "LAGGARD_ALERTS__ROUTES_FILE" in env:
        env["LAGGARD_ALERTS__ROUTES_FILE"] = str(files[env["LAGGARD_ALERTS__ROUTES_FILE"]])
    return {k: v for k, v in env.items() if k.startswith("LAGGARD_")}


def kubernetes_paths(objects, monkeypatch, tmp_path: Path) -> set[str]:
    paths = set()
    for rule in (o for o in objects if o["kind"] == "PrometheusRule"):
        if alert_names(rule["spec"]["groups"]) & STRAGGLER_RULES:
            paths.add("rules")
    env = collector_env(objects, tmp_path)
    routing = collector_routing(env, monkeypatch) if env is not None else None
    if routing and any(routing.receivers_for(labels) for labels in collector_alerts()):
        paths.add("collector")
    return paths


def with_component(tmp_path: Path, resources: list[str], component: Path) -> str:
    """A kustomization of deploy/kubernetes/<resources> with the component, as a site's overlay."""
    root = tmp_path / "site"
    root.mkdir()
    doc = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
           "resources": [os.path.relpath(KUBE / r, root) for r in resources],
           "components": [os.path.relpath(component, root)]}
    (root / "kustomization.yaml").write_text(yaml.safe_dump(doc))
    return str(root)


# Every way deploy/kubernetes is applied, and the path that pages. base alone has neither: no
# Prometheus, and no receiver the collector could know - it pages nobody until the site adds
# monitoring/ (the rules) or components/direct-alerts (the collector, with its receivers).
KUBERNETES = {
    "base": (["base"], None, set()),
    "base + monitoring": (["base", "monitoring"], None, {"rules"}),
    "overlays/full": (["overlays/full"], None, {"rules"}),
    "base + components/direct-alerts": (["base"], DIRECT_ALERTS, {"collector"}),
    "base + monitoring + components/direct-alerts": (["base", "monitoring"], DIRECT_ALERTS, {"collector"}),
    "overlays/full + components/direct-alerts": (["overlays/full"], DIRECT_ALERTS, {"collector"}),
}


@pytest.mark.parametrize("name", KUBERNETES)
def test_kubernetes_pages_once(name, monkeypatch, tmp_path):
    resources, component, expected = KUBERNETES[name]
    if component is None:
        objects = [o for r in resources for o in render(r)]
    else:
        objects = list(render(with_component(tmp_path, resources, component)))
    assert kubernetes_paths(objects, monkeypatch, tmp_path) == expected


def test_direct_alerts_component_removes_only_what_the_collector_pages(tmp_path):
    objects = render(with_component(tmp_path, ["overlays/full"], DIRECT_ALERTS))
    source = yaml.safe_load((REPO / "deploy" / "prometheus" / "laggard-alerts.yml").read_text())["groups"]
    rule = one(objects, "PrometheusRule", "laggard")
    assert alert_names(rule["spec"]["groups"]) == alert_names(source) - COLLECTOR_PAGES
    # Everything else of the PrometheusRule is as the rules file has it.
    kept = [{**g, "rules": [r for r in g["rules"] if r.get("alert") not in COLLECTOR_PAGES]} for g in source]
    assert rule["spec"]["groups"] == kept


def test_direct_alerts_component_example_secret_is_marked(tmp_path):
    objects = render(with_component(tmp_path, ["base"], DIRECT_ALERTS))
    secret = one(objects, "Secret", "laggard-alert-routes")
    assert secret["metadata"]["labels"]["laggard.io/example-values"] == "true"
    assert secret["metadata"]["namespace"] == "laggard"
    assert all("EXAMPLE" in value for value in secret["stringData"].values())


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_direct_alerts_component_objects_are_valid(version, tmp_path):
    objects = render(with_component(tmp_path, ["overlays/full"], DIRECT_ALERTS))
    for obj in objects:
        if obj["apiVersion"] == PROMETHEUS_OPERATOR:
            jsonschema.validate(obj, operator_schema(obj["kind"]))
        else:
            kubernetes_validate.validate(obj, version, strict=True)
    pod = one(objects, "Deployment", "laggard-collector")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True  # the patch merged, not replaced
    assert {m["name"] for m in container["volumeMounts"]} == {"tmp", "alert-routes"}
