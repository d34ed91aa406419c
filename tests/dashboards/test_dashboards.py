"""The dashboards, proven against the real thing: Debian's `prometheus` on a loopback port scrapes a
collector fed by a simulated fleet (real agent code on the simulated NVML library and IB tree,
pushing over HTTP), using dashboards/prometheus.yml with its interval shortened; then every
PromQL expression of every panel and annotation of every dashboard, template variables
substituted, is evaluated through Prometheus's HTTP API and must return data. The template
variables' own queries must offer the values substituted."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from server.alerts.settings import AlertSettings
from server.app import create_app
from server.detect.settings import DetectionSettings
from server.metrics.settings import MetricsSettings
from server.serve import start_in_thread
from server.settings import Settings
from tests.metrics.tools import Receiver, free_port, require_binary, stop_agents, wait_http

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = REPO / "dashboards"
CLUSTER = "sim"
RATE_INTERVAL = "15s"


def dashboard_files() -> list[Path]:
    return sorted(DASHBOARDS.glob("*.json"))


def test_the_json_is_what_generate_py_writes():
    proc = subprocess.run(["python", str(DASHBOARDS / "generate.py"), "--check"], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in dashboard_files()] == ["collector-health.json", "fleet-overview.json", "node-drilldown.json",
                                                  "straggler-detail.json"]


def test_dashboards_are_well_formed():
    uids = set()
    for path in dashboard_files():
        doc = json.loads(path.read_text())
        assert doc["uid"] not in uids
        uids.add(doc["uid"])
        names = [v["name"] for v in doc["templating"]["list"]]
        assert names[0] == "datasource"
        ids = [p["id"] for p in doc["panels"]]
        assert len(ids) == len(set(ids))
        for p in doc["panels"]:
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
            assert p["targets"], p["title"]
            assert 0 <= p["gridPos"]["x"] and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
            for t in p["targets"]:
                used = set(re.findall(r"\$(\w+)", t["expr"])) - {"__rate_interval"}
                assert used <= set(names), (p["title"], used)
    assert uids == {"laggard-fleet", "laggard-straggler", "laggard-node", "laggard-collector"}


def test_provisioning_files():
    ds = yaml.safe_load((DASHBOARDS / "provisioning/datasources/laggard-prometheus.yaml").read_text())
    assert ds["apiVersion"] == 1 and ds["datasources"][0]["type"] == "prometheus"
    dash = yaml.safe_load((DASHBOARDS / "provisioning/dashboards/laggard.yaml").read_text())
    assert dash["providers"][0]["type"] == "file" and dash["providers"][0]["options"]["path"]


def test_promtool_check_config():
    promtool = require_binary("promtool")
    proc = subprocess.run([promtool, "check", "config", str(DASHBOARDS / "prometheus.yml")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout + proc.stderr


# --- every panel against a real Prometheus ------------------------------------------------------------


class SimulatedFleet:
    """Four simulated 8-GPU nodes, each running the agent's sampling loop and pusher (1 s), and
    one Slurm job ("llm") over all of them, which the agents attribute (issue #15)."""

    FAULTS = {1: ["gpu3:thermal"], 2: ["gpu6:xid=79", "ib2:degraded"]}

    def __init__(self, url: str, nodes: int = 4):
        from agent.push import Pusher
        from agent.runner import Runner
        from agent.sim.fleet import SimFleet

        self.fleet = SimFleet()
        self.stop = threading.Event()
        self.agents = []
        for i in range(nodes):
            node = self.fleet.add_node(f"sim-node-{i}", model="h100", gpus=8, faults=self.FAULTS.get(i, []), seed=i, attribution=True)
            node.sim.run_slurm_job(4242, "llm", first_task=8 * i)
            info = {"version": "test", "driver": node.driver_version(), "cuda": node.cuda_version()}
            pusher = Pusher(url, node=node.name, cluster=CLUSTER, labels={"job": "llm"}, agent_info=info, batch_size=1, max_delay=1).start()
            thread = Runner(node, pusher, interval=1.0, read_nics=node.read_nics, stop=self.stop).start()
            self.agents.append((pusher, thread))

    def close(self) -> None:
        stop_agents(self.stop, self.agents, self.fleet)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    binary = require_binary("prometheus")
    promtool = require_binary("promtool")
    tmp = tmp_path_factory.mktemp("prom")
    receiver = Receiver()
    settings = Settings(
        database_url=f"sqlite:///{tmp / 'laggard.db'}", detection=DetectionSettings(open_after_s=0), detection_poll_s=0.1,
        metrics=MetricsSettings(flush_interval_s=0.5), webhook_urls=receiver.url, alerts=AlertSettings(group_wait_s=0.5, poll_s=0.1),
    )
    collector = start_in_thread(create_app(settings))
    fleet = SimulatedFleet(collector.url)
    # The shipped scrape config, pointed at this collector and sped up.
    config = yaml.safe_load((DASHBOARDS / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(REPO / "deploy/prometheus/laggard-alerts.yml")]
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "laggard"]
    job["scrape_timeout"] = "1s"
    job["static_configs"] = [{"targets": [f"127.0.0.1:{collector.url.rsplit(':', 1)[1]}"]}]
    config_path = tmp / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config))
    check = subprocess.run([promtool, "check", "config", str(config_path)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    port = free_port()
    proc = subprocess.Popen(
        [binary, f"--config.file={config_path}", f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
         "--log.level=warn"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/-/ready", proc=proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        fleet.close()
        collector.stop()
        receiver.close()


def query(prom: str, expr: str) -> list:
    r = httpx.get(f"{prom}/api/v1/query", params={"query": expr}, timeout=30)
    doc = r.json()
    assert r.status_code == 200 and doc["status"] == "success", (expr, doc)
    return doc["data"]["result"]


@pytest.fixture(scope="module")
def variables(prometheus):
    """Wait for the fleet's straggler to be scraped, with enough history for rate() windows; the
    template variables are the cluster, and the node, GPU and job of that straggler."""
    deadline = time.monotonic() + 90
    found = []
    while time.monotonic() < deadline:
        found = query(prometheus, f'laggard_straggler_active{{cluster="{CLUSTER}", cause="thermal"}}')
        scrapes = query(prometheus, 'count_over_time(up{job="laggard"}[1m])')
        xids = query(prometheus, "laggard_gpu_xid_errors_total")
        if found and xids and scrapes and float(scrapes[0]["value"][1]) >= 20:
            break
        time.sleep(0.5)
    assert found, "no thermal straggler reached Prometheus"
    labels = found[0]["metric"]
    assert (labels["node"], labels["gpu"], labels["job_name"]) == ("sim-node-1", "3", "llm")
    return {"cluster": CLUSTER, "node": labels["node"], "gpu": labels["gpu"], "job": labels["job_name"], "__rate_interval": RATE_INTERVAL}


def substitute(expr: str, values: dict[str, str]) -> str:
    return re.sub(r"\$(\w+)", lambda m: values[m.group(1)], expr)


def expressions(doc: dict) -> list[tuple[str, str]]:
    out = [(f"{p['title']} [{t['refId']}]", t["expr"]) for p in doc["panels"] for t in p["targets"]]
    out += [(f"annotation {a['name']}", a["expr"]) for a in doc["annotations"]["list"] if a.get("expr")]
    return out


@pytest.mark.parametrize("name", ["fleet-overview.json", "straggler-detail.json", "node-drilldown.json", "collector-health.json"])
def test_every_panel_returns_data(prometheus, variables, name):
    doc = json.loads((DASHBOARDS / name).read_text())
    empty = []
    for title, expr in expressions(doc):
        promql = substitute(expr, variables)
        result = query(prometheus, promql)
        if not result:
            empty.append((title, promql))
        # "or vector(0)" keeps a stat readable when nothing is wrong; the series behind it must exist too.
        if promql.endswith(" or vector(0)") and not query(prometheus, promql.removesuffix(" or vector(0)")):
            empty.append((title, promql))
    assert not empty, "panels without data:\n" + "\n".join(f"  {t}: {e}" for t, e in empty)


def test_template_variables_offer_the_values_used(prometheus, variables):
    """label_values(metric{selector}, label): the values Grafana would offer, via /api/v1/series."""
    docs = [json.loads(p.read_text()) for p in dashboard_files()]
    checked = set()
    for doc in docs:
        for var in doc["templating"]["list"]:
            if var["type"] != "query":
                continue
            m = re.fullmatch(r"label_values\((.+), (\w+)\)", var["definition"])
            assert m, var["definition"]
            selector, label = substitute(m.group(1), variables), m.group(2)
            r = httpx.get(f"{prometheus}/api/v1/series", params={"match[]": selector, "start": time.time() - 300}, timeout=30).json()
            offered = {s[label] for s in r["data"] if label in s}
            assert variables[var["name"]] in offered, (var["name"], offered)
            checked.add(var["name"])
    assert checked == {"cluster", "node", "gpu", "job"}


def test_dcgm_dashboards_can_select_a_node(prometheus, variables):
    """Issue #16: NVIDIA's dcgm-exporter dashboard selects a node by `instance` and names lines by
    `gpu`. Through the shipped scrape job (honor_labels), each node's per-GPU series carry that node
    as `instance`, as if its own exporter were scraped, while the collector's own series (and `up`)
    keep the collector's address."""
    nodes = [f"sim-node-{i}" for i in range(4)]
    (count,) = query(prometheus, 'count(count by (instance) (DCGM_FI_DEV_GPU_TEMP{job="laggard"}))')
    assert float(count["value"][1]) == len(nodes)
    gpu5 = [s["metric"] for s in query(prometheus, 'DCGM_FI_DEV_GPU_TEMP{job="laggard", gpu="5"}')]
    assert sorted(s["instance"] for s in gpu5) == nodes
    for s in gpu5:
        assert s["Hostname"] == s["hostname"] == s["instance"] and s["cluster"] == CLUSTER, s
        assert s["device"] == "nvidia5" and re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]", s["pci_bus_id"]), s
        assert s["DCGM_FI_DRIVER_VERSION"] and "exported_instance" not in s, s
    r = httpx.get(f"{prometheus}/api/v1/label/instance/values", params={"match[]": 'DCGM_FI_DEV_GPU_TEMP{job="laggard"}'}, timeout=30)
    assert r.json()["data"] == nodes  # what a dashboard's label_values(DCGM_FI_DEV_GPU_TEMP, instance) offers
    (up,) = query(prometheus, 'up{job="laggard"}')
    collector = up["metric"]["instance"]
    assert collector not in nodes
    for own in ("laggard_build_info", "laggard_nodes_reporting", "process_resident_memory_bytes"):
        assert {s["metric"]["instance"] for s in query(prometheus, f'{own}{{job="laggard"}}')} == {collector}, own


def test_scrape_configs_honor_the_collectors_labels():
    """Every shipped scrape config of the collector keeps the `instance` its per-GPU series carry."""
    for path in (DASHBOARDS / "prometheus.yml", REPO / "deploy/compose/prometheus.yml"):
        (job,) = [j for j in yaml.safe_load(path.read_text())["scrape_configs"] if j["job_name"] == "laggard"]
        assert job.get("honor_labels") is True, path
    monitor = yaml.safe_load((REPO / "deploy/kubernetes/monitoring/servicemonitor.yaml").read_text())
    assert [e.get("honorLabels") for e in monitor["spec"]["endpoints"]] == [True]
    assert "honor_labels: true" in (REPO / "docs/observability.md").read_text()


def wait_for_alert(prometheus: str, wanted, timeout: float = 60.0) -> list:
    """Prometheus' alerts once one of them is `wanted`, or the last answer at the deadline."""
    deadline = time.monotonic() + timeout
    alerts: list = []
    while time.monotonic() < deadline:
        alerts = httpx.get(f"{prometheus}/api/v1/alerts", timeout=30).json()["data"]["alerts"]
        if any(wanted(a) for a in alerts):
            break
        time.sleep(0.5)
    return alerts


def test_alerting_rules_load_and_evaluate(prometheus, variables):
    """The rules file is loaded by this Prometheus, and its straggler rule fires on the fleet's straggler."""
    rules = httpx.get(f"{prometheus}/api/v1/rules", timeout=30).json()["data"]["groups"]
    assert {g["name"] for g in rules} == {"laggard-stragglers", "laggard-collector"}
    assert all(r["health"] != "err" for g in rules for r in g["rules"]), rules
    def ours(alert: dict) -> bool:  # critical fires at once; a warning would be pending for 15 min
        return (alert["labels"]["alertname"] in ("LaggardStragglerCritical", "LaggardStragglerWarning")
                and alert["labels"].get("node") == variables["node"] and alert["labels"].get("gpu") == variables["gpu"])

    alerts = wait_for_alert(prometheus, ours)
    assert any(ours(a) for a in alerts), alerts


def test_an_expression_without_data_would_be_caught(prometheus, variables):
    assert query(prometheus, 'laggard_straggler_active{cluster="no-such-cluster"}') == []


def test_the_first_xid_of_a_gpu_fires_the_hardware_xid_rule(prometheus):
    """Issue #16: the fleet's only XID (79 on sim-node-2 GPU 6, reported once) is the first of its
    GPU, so its counter series is born at 1 and increase() over it is 0. The rule must fire on
    series as this real scrape produces them, not on hand-written input series seeded at 0."""
    def xid_alert(alert: dict) -> bool:
        labels = alert["labels"]
        return (labels["alertname"] == "LaggardHardwareXid" and labels.get("node") == "sim-node-2" and labels.get("gpu") == "6"
                and labels.get("xid") == "79" and alert["state"] == "firing")

    alerts = wait_for_alert(prometheus, xid_alert)
    assert any(xid_alert(a) for a in alerts), [a["labels"] for a in alerts]
    # Reported once: the counter never left 1, so a rule on increase() alone could not have fired.
    counter = query(prometheus, 'laggard_gpu_xid_errors_total{node="sim-node-2",gpu="6",xid="79"}')
    assert [float(s["value"][1]) for s in counter] == [1.0]


# --- NVIDIA's dcgm-exporter dashboard, every variant, against the same Prometheus (issue #16) ---------------
#
# The queries of NVIDIA's Grafana dashboard for dcgm-exporter, written here from what its panels
# ask for (not from its file): per-GPU series selected by the node and GPU template variables, in
# two variants, one selecting the node by `instance`, the other by `Hostname` (whose utilisation
# panel shows DCGM_FI_PROF_GR_ENGINE_ACTIVE instead of DCGM_FI_DEV_GPU_UTIL). $node below stands
# for the variant's node variable.

NVIDIA_VARIANTS = {"instance": "instance", "Hostname": "Hostname"}  # variant -> the label its node variable selects on
NVIDIA_PANELS = {
    # panel title -> expression; SEL is the variant's selector
    "GPU Temperature": "DCGM_FI_DEV_GPU_TEMP{SEL}",
    "GPU Avg Temp": "avg(DCGM_FI_DEV_GPU_TEMP{SEL})",
    "GPU Power Usage": "DCGM_FI_DEV_POWER_USAGE{SEL}",
    "GPU Power Total": "sum(DCGM_FI_DEV_POWER_USAGE{SEL})",
    "GPU SM Clocks": "DCGM_FI_DEV_SM_CLOCK{SEL} * 1000000",
    "GPU Memory Clocks": "DCGM_FI_DEV_MEM_CLOCK{SEL} * 1000000",
    "GPU Utilization": "DCGM_FI_DEV_GPU_UTIL{SEL}",
    "Memory Copy Utilization": "DCGM_FI_DEV_MEM_COPY_UTIL{SEL}",
    "Tensor Core Utilization": "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{SEL}",
    "GPU Framebuffer Mem Used": "DCGM_FI_DEV_FB_USED{SEL}",
    "GPU Framebuffer Mem Free": "DCGM_FI_DEV_FB_FREE{SEL}",
    "GPU Framebuffer Mem Used %": "DCGM_FI_DEV_FB_USED{SEL} / (DCGM_FI_DEV_FB_USED{SEL} + DCGM_FI_DEV_FB_FREE{SEL})",
    # Energy: what the GPU drew over the window (J) and the average power it implies (mJ/s -> W).
    "GPU Energy": "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{SEL} / 1000",
    "GPU Energy Rate": "rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{SEL}[$__rate_interval]) / 1000",
    "GPU Energy Used": "increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{SEL}[$__rate_interval]) / 1000",
}
NVIDIA_HOSTNAME_ONLY = {
    "GPU Utilization (GR engine)": "DCGM_FI_PROF_GR_ENGINE_ACTIVE{SEL}",
}
# The rest of dcgm-exporter's default set: a dashboard may chart any of them.
DCGM_DEFAULT_EXTRAS = {
    "DRAM Active": "DCGM_FI_PROF_DRAM_ACTIVE{SEL}",
    "Encoder Utilization": "DCGM_FI_DEV_ENC_UTIL{SEL}",
    "Decoder Utilization": "DCGM_FI_DEV_DEC_UTIL{SEL}",
    "Framebuffer Reserved": "DCGM_FI_DEV_FB_RESERVED{SEL}",
    "Correctable Remapped Rows": "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS{SEL}",
    "Uncorrectable Remapped Rows": "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{SEL}",
    "Row Remap Failure": "DCGM_FI_DEV_ROW_REMAP_FAILURE{SEL}",
}


def offered(prometheus: str, selector: str, label: str) -> list[str]:
    """What Grafana's label_values(selector, label) offers."""
    r = httpx.get(f"{prometheus}/api/v1/series", params={"match[]": selector, "start": time.time() - 300}, timeout=30).json()
    return sorted({s[label] for s in r["data"] if label in s})


def grafana_value(values: list[str]) -> str:
    """A multi-value variable as Grafana writes it into a =~ matcher (one value, or All): regex
    metacharacters escaped with a backslash, doubled inside the PromQL string."""
    escaped = [re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\\\1", v) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


@pytest.mark.parametrize("variant", sorted(NVIDIA_VARIANTS))
def test_nvidias_dcgm_dashboard_every_panel_returns_data(prometheus, variables, variant):
    """Issue #16: each variant of NVIDIA's dcgm-exporter dashboard against the simulated fleet:
    its template variables offer the fleet's nodes and GPUs, and every panel returns data, for one
    node and GPU as for All."""
    label = NVIDIA_VARIANTS[variant]
    nodes = offered(prometheus, "DCGM_FI_DEV_GPU_TEMP", label)  # label_values(DCGM_FI_DEV_GPU_TEMP, instance | Hostname)
    assert nodes == [f"sim-node-{i}" for i in range(4)], (variant, nodes)
    node = variables["node"]
    gpus = offered(prometheus, f'DCGM_FI_DEV_GPU_TEMP{{{label}=~"{node}"}}', "gpu")  # label_values(..., gpu)
    assert gpus == [str(i) for i in range(8)]
    panels = NVIDIA_PANELS | (NVIDIA_HOSTNAME_ONLY if variant == "Hostname" else {}) | DCGM_DEFAULT_EXTRAS
    empty = []
    for choice, (node_value, gpu_value) in {"one": (node, variables["gpu"]), "All": (grafana_value(nodes), grafana_value(gpus))}.items():
        selector = f'{{{label}=~"{node_value}", gpu=~"{gpu_value}"}}'
        for title, expr in panels.items():
            promql = substitute(expr.replace("{SEL}", selector), variables)
            result = query(prometheus, promql)
            if not result:
                empty.append((choice, title, promql))
            elif choice == "All" and not title.startswith(("GPU Avg", "GPU Power Total")):
                # One line per GPU of the fleet (GR engine and DRAM too: every simulated node is an H100).
                assert len(result) == len(nodes) * len(gpus), (title, len(result))
    assert not empty, "panels without data:\n" + "\n".join(f"  [{c}] {t}: {e}" for c, t, e in empty)


def test_nvidias_energy_panel_agrees_with_the_power_panel(prometheus, variables):
    """The energy counter is in mJ: its rate, in W, is the average power drawn over the same window
    (a window the fleet has been running for throughout: rate() does not extrapolate past a
    series' start)."""
    window = variables["__rate_interval"]
    (energy,) = query(prometheus, f'sum(rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{job="laggard"}}[{window}])) / 1000')
    (power,) = query(prometheus, f'sum(avg_over_time(DCGM_FI_DEV_POWER_USAGE{{job="laggard"}}[{window}]))')
    assert float(energy["value"][1]) == pytest.approx(float(power["value"][1]), rel=0.1)
    # The GR engine and DRAM ratios are ratios: a busy H100 fleet is busy nearly all the time.
    for series in query(prometheus, 'DCGM_FI_PROF_GR_ENGINE_ACTIVE{job="laggard"}'):
        assert 0.9 <= float(series["value"][1]) <= 1.0, series
    for series in query(prometheus, 'DCGM_FI_PROF_DRAM_ACTIVE{job="laggard"}'):
        assert 0.0 < float(series["value"][1]) < 1.0, series
