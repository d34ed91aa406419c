"""docker-compose.yml: the file as Compose itself reads it (`docker compose config`, or v1's
`docker-compose config`; required under CI, skipped locally when neither exists), then every
service's command parsed by the real command line it names, the simulated agents run once for
real, and the configuration files it mounts checked by their own tools."""

from __future__ import annotations

import functools
import json
import posixpath
import shutil
import subprocess
from urllib.parse import urlsplit

import pytest
import yaml

from agent.cli import parse_config, parse_simulate
from agent.sim.faults import parse_fault_spec
from agent.sim.infiniband import is_ib_fault
from server.alerts.routing import load_routing
from server.cli.main import _parser as laggard_parser
from tests.deploy.tools import REPO, VENV_BIN, require_tool

COMPOSE_FILE = REPO / "docker-compose.yml"
COMPOSE_DIR = REPO / "deploy" / "compose"
PRODUCT = {"postgres", "collector", "prometheus", "grafana", "alertmanager"}


def compose_command() -> list[str]:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True, timeout=30).returncode == 0:
        return [docker, "compose"]
    return [require_tool("docker-compose", "Debian package docker-compose; .ci/run installs it")]


@functools.cache
def resolved() -> dict:
    """The file after Compose's own parsing: anchors merged, paths made absolute, schema checked."""
    proc = subprocess.run([*compose_command(), "-f", str(COMPOSE_FILE), "config"], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)


@pytest.fixture(scope="module")
def services():
    return resolved()["services"]


def agents(services) -> dict[str, dict]:
    return {name: s for name, s in services.items() if (s.get("command") or [None])[0] == "laggard-agent"}


def bind_mounts(service: dict) -> dict[str, str]:
    """container path -> host path; Compose v1 writes short strings, v2 long mappings."""
    mounts = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            source, target = volume.split(":")[:2]
        elif volume.get("type") == "bind":
            source, target = volume["source"], volume["target"]
        else:
            continue
        if source.startswith("/"):
            mounts[target] = source
    return mounts


def test_the_whole_product_is_there(services):
    assert PRODUCT <= set(services)
    fleet = agents(services)
    assert len(fleet) >= 3
    assert any("--fault" in s["command"] for s in fleet.values())  # something to find


def test_images_are_pinned(services):
    for name, service in services.items():
        image = service["image"]
        tag = image.rpartition(":")[2]
        assert ":" in image and tag != "latest" and "/" not in tag, f"{name}: {image}"


def test_agent_commands_are_ones_a_user_can_run(services):
    for name, service in agents(services).items():
        env = {k: str(v) for k, v in service.get("environment", {}).items()}
        cfg = parse_config(service["command"][1:], env=env)  # exits 2 on a bad flag or value
        assert cfg.simulate is not None, name
        assert urlsplit(cfg.collector).hostname in services, f"{name}: {cfg.collector}"
        model, count = parse_simulate(service["command"][service["command"].index("--simulate") + 1])
        for spec in cfg.faults:
            if not is_ib_fault(spec):
                assert parse_fault_spec(spec).gpu < count, f"{name}: {spec}"
    nodes = [parse_config(s["command"][1:], env={}).node for s in agents(services).values()]
    assert len(set(nodes)) == len(nodes), "two agents report the same node"


def test_each_simulated_agent_takes_a_sample(services, tmp_path):
    """The agents' own commands, outside Docker, with --once: one batch each, faults injected."""
    for name, service in agents(services).items():
        env = {k: str(v) for k, v in service.get("environment", {}).items()}
        proc = subprocess.run([str(VENV_BIN / "laggard-agent"), *service["command"][1:], "--once"],
                              env={**env, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, f"{name}: {proc.stderr}"
        batch = json.loads(proc.stdout)
        assert batch["cluster"] == env["LAGGARD_CLUSTER"] and batch["samples"][0]["gpus"], name


def test_collector_command_and_settings(services, monkeypatch):
    collector = services["collector"]
    args = laggard_parser().parse_args(collector["command"][1:])
    assert (args.command, args.host, args.port) == ("server", "0.0.0.0", 8080)
    env = {k: str(v) for k, v in collector["environment"].items()}
    assert env["LAGGARD_INSECURE"] == "1"
    db = urlsplit(env["LAGGARD_DATABASE_URL"])
    assert db.scheme == "postgresql" and db.hostname == "postgres" and db.path == f"/{services['postgres']['environment']['POSTGRES_DB']}"
    from server.settings import Settings

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = Settings()
    assert not settings.is_sqlite
    assert collector["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_collector_alert_routes_reach_the_compose_alertmanager(services):
    collector = services["collector"]
    routes_in_container = collector["environment"]["LAGGARD_ALERTS__ROUTES_FILE"]
    routes = bind_mounts(collector)[routes_in_container]
    routing = load_routing(routes_file=routes)
    (alertmanager,) = routing.alertmanagers()
    assert urlsplit(alertmanager.url).hostname == "alertmanager"


def test_mounted_files_exist(services):
    for name, service in services.items():
        for target, source in bind_mounts(service).items():
            assert (REPO / source).exists(), f"{name}: {source} -> {target}"


def test_prometheus_config_is_valid_and_scrapes_the_collector(services):
    promtool = require_tool("promtool", "Debian package prometheus; .ci/run installs it")
    config = COMPOSE_DIR / "prometheus.yml"
    proc = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = yaml.safe_load(config.read_text())
    (job,) = doc["scrape_configs"]
    assert job["job_name"] == "laggard"  # what the dashboards and rules select
    assert job["static_configs"][0]["targets"] == ["collector:8080"]
    assert doc["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["alertmanager:9093"]
    # The rule file resolves, relative to the config, both here and where compose mounts it.
    mounts = bind_mounts(services["prometheus"])
    assert mounts["/etc/prometheus/prometheus.yml"] == str(config)
    (rules,) = doc["rule_files"]
    in_container = "/etc/prometheus/" + rules
    assert mounts[posixpath.normpath(in_container)] == str((config.parent / rules).resolve())


def test_alertmanager_config_is_valid(services):
    amtool = require_tool("amtool", "Debian package prometheus-alertmanager; .ci/run installs it")
    proc = subprocess.run([amtool, "check-config", str(COMPOSE_DIR / "alertmanager.yml")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert bind_mounts(services["alertmanager"])["/etc/alertmanager/alertmanager.yml"] == str(COMPOSE_DIR / "alertmanager.yml")


def test_grafana_is_provisioned_with_the_dashboards(services):
    mounts = bind_mounts(services["grafana"])
    provisioning = REPO / "dashboards" / "provisioning"
    assert mounts["/etc/grafana/provisioning/datasources"] == str(provisioning / "datasources")
    assert mounts["/etc/grafana/provisioning/dashboards"] == str(provisioning / "dashboards")
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "laggard.yaml").read_text())["providers"]
    assert mounts[provider["options"]["path"]] == str(REPO / "dashboards")
    (datasource,) = yaml.safe_load((provisioning / "datasources" / "laggard-prometheus.yaml").read_text())["datasources"]
    assert urlsplit(datasource["url"]).hostname == "prometheus" and "prometheus" in services
