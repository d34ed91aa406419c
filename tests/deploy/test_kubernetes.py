"""deploy/kubernetes: rendered by the real `kubectl kustomize`, every object validated against the
Kubernetes API schemas (kubernetes-validate, strict: unknown fields fail) of named versions, the
prometheus-operator objects against a schema of their CRDs' fields, and then what the manifests
promise: where the agent runs, what it reads, how it is probed, how the collector scales.

kubectl is required under CI (CI set) and skipped locally when missing."""

from __future__ import annotations

import copy
import functools
import json
import subprocess
import sys

import jsonschema
import kubernetes_validate
import pytest
import yaml

from agent.cli import parse_config
from agent.k8s_labels import build_parser as k8s_labels_parser
from agent.k8s_labels import parse_map
from server.cli.main import _parser as laggard_parser
from tests.deploy.tools import REPO, VENV_BIN, require_tool

KUBE = REPO / "deploy" / "kubernetes"
KUSTOMIZATIONS = ("base", "scheduler", "monitoring", "overlays/full")
# The oldest Kubernetes we claim (kubescheduler.config.k8s.io/v1 needs 1.25; PodDisruptionBudget
# policy/v1 1.21) and the newest kubernetes-validate knows.
K8S_VERSIONS = ("1.30.0", "1.37.0")
PROMETHEUS_OPERATOR = "monitoring.coreos.com/v1"
OPERATOR_SCHEMA = json.loads((REPO / "tests" / "deploy" / "prometheus_operator.schema.json").read_text())


@functools.cache
def render(kustomization: str) -> tuple[dict, ...]:
    kubectl = require_tool("kubectl", "https://kubernetes.io/docs/tasks/tools/; needed to render deploy/kubernetes")
    proc = subprocess.run([kubectl, "kustomize", str(KUBE / kustomization)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"kubectl kustomize {kustomization} failed:\n{proc.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(proc.stdout) if doc)


def one(objects, kind: str, name: str) -> dict:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return copy.deepcopy(found[0])


def containers(obj: dict) -> list[dict]:
    spec = obj["spec"]["template"]["spec"]
    return spec.get("initContainers", []) + spec["containers"]


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def workloads(objects) -> list[dict]:
    return [o for o in objects if o["kind"] in ("Deployment", "DaemonSet", "StatefulSet", "Job")]


@pytest.fixture(scope="module")
def full():
    return render("overlays/full")


@pytest.fixture(scope="module")
def base():
    return render("base")


# --- schemas ----------------------------------------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_object_is_valid_kubernetes(kustomization, version):
    objects = render(kustomization)
    assert objects
    for obj in objects:
        if obj["apiVersion"] == PROMETHEUS_OPERATOR:
            continue  # no schema in kubernetes-validate: test_prometheus_operator_objects_match_their_crds
        kubernetes_validate.validate(obj, version, strict=True)


def test_strict_validation_rejects_a_misspelt_field(base):
    daemonset = one(base, "DaemonSet", "laggard-agent")
    daemonset["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {"path": "/healthz", "port": 9401}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, K8S_VERSIONS[0], strict=True)


def operator_schema(kind: str) -> dict:
    return {**OPERATOR_SCHEMA["$defs"][kind], "$defs": OPERATOR_SCHEMA["$defs"]}


def test_prometheus_operator_objects_match_their_crds():
    objects = [o for o in render("monitoring") if o["apiVersion"] == PROMETHEUS_OPERATOR]
    assert sorted(o["kind"] for o in objects) == ["PrometheusRule", "ServiceMonitor"]
    for obj in objects:
        jsonschema.validate(obj, operator_schema(obj["kind"]))
    monitor = one(objects, "ServiceMonitor", "laggard-collector")
    monitor["spec"]["endpoints"][0]["scrape_timeout"] = "10s"  # Prometheus' spelling, not the CRD's
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(monitor, operator_schema("ServiceMonitor"))


# --- everything -------------------------------------------------------------------------------


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_images_are_pinned_by_tag(kustomization):
    for workload in workloads(render(kustomization)):
        for c in containers(workload):
            image = c["image"]
            name, _, tag = image.rpartition(":") if "@" not in image else (image, "", "digest")
            assert name and "/" not in tag and tag not in ("", "latest"), f"{workload['metadata']['name']}/{c['name']}: {image}"


def test_everything_lives_in_the_laggard_namespace(full):
    cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
    for obj in full:
        if obj["kind"] not in cluster_scoped:
            assert obj["metadata"].get("namespace") == "laggard", f"{obj['kind']}/{obj['metadata']['name']}"


def test_containers_run_unprivileged_with_small_resources(full):
    for workload in workloads(full):
        pod = workload["spec"]["template"]["spec"]
        for c in containers(workload):
            sc = {**pod.get("securityContext", {}), **c.get("securityContext", {})}
            where = f"{workload['metadata']['name']}/{c['name']}"
            assert sc.get("runAsNonRoot") is True and sc.get("runAsUser", 0) > 0, where
            assert sc.get("readOnlyRootFilesystem") is True and sc.get("allowPrivilegeEscalation") is False, where
            assert c["resources"]["requests"]["memory"] and c["resources"]["limits"]["memory"], where


def test_example_secrets_are_marked(base):
    secrets = [o for o in base if o["kind"] == "Secret"]
    assert {s["metadata"]["name"] for s in secrets} == {"laggard-collector", "laggard-auth"}
    for secret in secrets:
        assert secret["metadata"]["labels"]["laggard.io/example-values"] == "true"
        assert all("EXAMPLE" in value for value in secret["stringData"].values())


# --- the agent DaemonSet ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def agent(base):
    return one(base, "DaemonSet", "laggard-agent")


def agent_container(agent: dict) -> dict:
    (c,) = [c for c in agent["spec"]["template"]["spec"]["containers"] if c["name"] == "agent"]
    return c


def agent_config(objects) -> dict[str, str]:
    return one(objects, "ConfigMap", "laggard-agent-config")["data"]


def test_agent_runs_only_on_gpu_nodes_and_tolerates_their_taints(agent):
    pod = agent["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]}]
    tolerated = {(t["key"], t.get("effect")) for t in pod["tolerations"] if t["operator"] == "Exists"}
    assert ("nvidia.com/gpu", "NoSchedule") in tolerated
    assert ("laggard.io/straggler", None) in tolerated  # Laggard's own taint, every effect
    assert pod["priorityClassName"] == "system-node-critical"


def test_agent_sees_the_gpus_through_the_nvidia_runtime(agent):
    pod = agent["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia"
    env = env_of(agent_container(agent))
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    # It watches GPUs, it must not take one away from the workloads.
    assert "nvidia.com/gpu" not in json.dumps(agent_container(agent)["resources"])


def test_agent_node_name_comes_from_the_downward_api(agent):
    for c in containers(agent):
        assert env_of(c)["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}, c["name"]


def test_agent_reads_the_hosts_sys_read_only(agent):
    pod = agent["spec"]["template"]["spec"]
    c = agent_container(agent)
    (volume,) = [v for v in pod["volumes"] if v.get("hostPath", {}).get("path") == "/sys"]
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True
    assert env_of(c)["LAGGARD_SYSFS_ROOT"]["value"] == mount["mountPath"]


def test_agent_spool_directory_is_writable(agent):
    import agent.cli as agent_cli  # the spool is newer than the rest of the agent

    spool = getattr(agent_cli, "DEFAULT_SPOOL_DIR", None)
    if spool is None:
        pytest.skip("this agent has no spool")
    c = agent_container(agent)
    volumes = {v["name"]: v for v in agent["spec"]["template"]["spec"]["volumes"]}
    writable = [m for m in c["volumeMounts"] if not m.get("readOnly") and (spool + "/").startswith(m["mountPath"].rstrip("/") + "/")]
    assert writable, f"{spool} is on the read-only root file system"
    assert "emptyDir" in volumes[writable[0]["name"]]


def test_agent_probes_hit_healthz_on_its_metrics_port(agent, base):
    c = agent_container(agent)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    metrics_port = agent_config(base)["LAGGARD_METRICS_PORT"]
    for probe in ("livenessProbe", "readinessProbe"):
        get = c[probe]["httpGet"]
        assert get["path"] == "/healthz"
        assert str(ports[get["port"]]) == metrics_port.rpartition(":")[2], probe


def test_agent_settings_come_from_the_configmap_and_the_secret(agent, base):
    c = agent_container(agent)
    assert {"configMapRef": {"name": "laggard-agent-config"}} in c["envFrom"]
    assert env_of(c)["LAGGARD_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "laggard-auth", "key": "agent-token"}}
    assert "agent-token" in one(base, "Secret", "laggard-auth")["stringData"]
    # The pod's environment is one laggard-agent accepts (it exits 2 on a bad value).
    env = {**agent_config(base), "NODE_NAME": "gpu-node-1", "LAGGARD_SYSFS_ROOT": "/host/sys", "LAGGARD_TOKEN": "t"}
    cfg = parse_config([], env=env)
    assert (cfg.collector, cfg.cluster, cfg.node, cfg.token) == (env["LAGGARD_COLLECTOR_URL"], env["LAGGARD_CLUSTER"], "gpu-node-1", "t")


def test_agent_labels_initcontainer_is_a_valid_k8s_labels_run(agent, base):
    (init,) = agent["spec"]["template"]["spec"]["initContainers"]
    assert init["command"][:3] == ["python", "-m", "agent.k8s_labels"]
    args = k8s_labels_parser({}).parse_args(init["command"][3:])
    assert env_of(init)["LAGGARD_NODE_LABELS"]["valueFrom"]["configMapKeyRef"] == {
        "name": "laggard-agent-config", "key": "LAGGARD_NODE_LABELS"}
    assert parse_map(agent_config(base)["LAGGARD_NODE_LABELS"])  # the example mapping parses
    # It writes where the main container reads, on a volume both mount.
    volume_of = {c["name"]: {m["mountPath"]: m["name"] for m in c["volumeMounts"]} for c in containers(agent)}
    directory = args.output.rpartition("/")[0]
    assert volume_of[init["name"]][directory] == volume_of["agent"][directory]
    assert args.output in agent_container(agent)["command"][2]


def test_agent_wrapper_exports_the_labels_file_to_the_real_agent(agent, tmp_path):
    """The main container's sh wrapper, run for real with the labels file in a temporary place:
    the labels reach laggard-agent (one simulated sample, printed) next to the args given."""
    (init,) = agent["spec"]["template"]["spec"]["initContainers"]
    labels_file = k8s_labels_parser({}).parse_args(init["command"][3:]).output
    written = tmp_path / "labels"
    written.write_text("partition=a3-highgpu-8g,rack=r7\n")  # the line agent.k8s_labels writes
    c = agent_container(agent)
    shell, flag, script, name = c["command"]
    proc = subprocess.run(
        [shell, flag, script.replace(labels_file, str(written)), name,
         "--simulate", "H100:1", "--once", "--node", "n1", "--label", "rack=r9"],
        capture_output=True, text=True, timeout=60, env={"PATH": f"{VENV_BIN}:/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["labels"] == {"partition": "a3-highgpu-8g", "rack": "r9"}  # args win per key

    missing = subprocess.run([shell, flag, script.replace(labels_file, str(tmp_path / "absent")), name, "--once"],
                             capture_output=True, text=True, timeout=60, env={"PATH": f"{VENV_BIN}:/usr/bin:/bin"})
    assert missing.returncode != 0  # no labels file: the container fails rather than run unlabelled


def test_agent_rbac_lets_it_get_nodes_and_list_pods_and_nothing_else(agent, base):
    """get on nodes (the labels initContainer); get/list on pods (workload attribution lists this
    node's pods, docs/attribution.md); no other role is bound to the agent's account."""
    account = agent["spec"]["template"]["spec"]["serviceAccountName"]
    one(base, "ServiceAccount", account)
    expected = {
        "laggard-agent-node-reader": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}],
        "laggard-agent-pod-reader": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
    }
    for name, rules in expected.items():
        role = one(base, "ClusterRole", name)
        assert role["rules"] == rules
        binding = one(base, "ClusterRoleBinding", name)
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": agent["metadata"]["namespace"]}]
    bound = {doc["roleRef"]["name"] for doc in base if doc["kind"] in ("ClusterRoleBinding", "RoleBinding")
             and any(s.get("name") == account for s in doc.get("subjects", []))}
    assert bound == set(expected)


def test_agent_reads_the_hosts_proc_read_only_without_host_pid(agent):
    """NVML reports host PIDs: attribution reads the host's /proc through a read-only mount,
    named by LAGGARD_PROC_ROOT, rather than joining the host's PID namespace."""
    pod = agent["spec"]["template"]["spec"]
    assert not pod.get("hostPID", False)
    c = agent_container(agent)
    (volume,) = [v for v in pod["volumes"] if v.get("hostPath", {}).get("path") == "/proc"]
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True
    assert env_of(c)["LAGGARD_PROC_ROOT"]["value"] == mount["mountPath"] == "/host/proc"
    assert "LAGGARD_ATTRIBUTION" not in env_of(c)  # auto: on


# --- the collector ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def collector(base):
    return one(base, "Deployment", "laggard-collector")


def collector_container(collector: dict) -> dict:
    (c,) = collector["spec"]["template"]["spec"]["containers"]
    return c


def test_collector_runs_two_replicas_on_postgresql(collector, base, monkeypatch):
    assert collector["spec"]["replicas"] == 2
    c = collector_container(collector)
    ref = env_of(c)["LAGGARD_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    url = one(base, "Secret", ref["name"])["stringData"][ref["key"]]
    assert url.startswith("postgresql://")  # several replicas need PostgreSQL (docs/operations.md)
    args = laggard_parser().parse_args(c["command"][1:] + c.get("args", []))
    assert args.command == "server"
    # The settings the pod gets are ones the collector accepts.
    from server.settings import Settings

    for key, value in one(base, "ConfigMap", "laggard-collector-config")["data"].items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("LAGGARD_DATABASE_URL", url)
    settings = Settings()
    assert (settings.host, settings.port, settings.is_sqlite) == ("0.0.0.0", 8080, False)


def test_collector_probes_and_service(collector, base):
    c = collector_container(collector)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert ports[c["readinessProbe"]["httpGet"]["port"]] == ports[c["livenessProbe"]["httpGet"]["port"]] == 8080
    service = one(base, "Service", "laggard-collector")
    pod_labels = collector["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (port,) = service["spec"]["ports"]
    assert ports[port["targetPort"]] == 8080


def test_collector_disruption_budget_keeps_one(collector, base):
    pdb = one(base, "PodDisruptionBudget", "laggard-collector")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= collector["spec"]["template"]["metadata"]["labels"].items()


def test_everyone_finds_the_collector_at_its_service(full):
    service = one(full, "Service", "laggard-collector")
    address = f"http://{service['metadata']['name']}.{service['metadata']['namespace']}.svc.cluster.local:{service['spec']['ports'][0]['port']}"
    assert agent_config(full)["LAGGARD_COLLECTOR_URL"] == address
    sync = one(full, "Deployment", "laggard-k8s-sync")
    (sync_container,) = sync["spec"]["template"]["spec"]["containers"]
    assert env_of(sync_container)["LAGGARD_SERVER"]["value"] == address
    scheduler = yaml.safe_load(one(full, "ConfigMap", "laggard-kube-scheduler-config")["data"]["kube-scheduler-config.yaml"])
    (extender,) = scheduler["extenders"]
    cluster = agent_config(full)["LAGGARD_CLUSTER"]
    assert extender["urlPrefix"] == f"{address}/scheduler/clusters/{cluster}"


# --- the scheduler side -----------------------------------------------------------------------


def test_scheduler_config_travels_unchanged():
    configmap = one(render("scheduler"), "ConfigMap", "laggard-kube-scheduler-config")
    text = (KUBE / "scheduler" / "kube-scheduler-config.yaml").read_text()
    assert configmap["data"] == {"kube-scheduler-config.yaml": text}
    assert yaml.safe_load(text)["kind"] == "KubeSchedulerConfiguration"


def test_k8s_sync_command_parses_and_has_a_token(full):
    sync = one(full, "Deployment", "laggard-k8s-sync")
    (c,) = sync["spec"]["template"]["spec"]["containers"]
    assert c["args"][0] == "laggard"
    args = laggard_parser().parse_args(c["args"][1:])
    assert (args.command, args.apply, args.cluster) == ("k8s-sync", True, agent_config(full)["LAGGARD_CLUSTER"])
    ref = env_of(c)["LAGGARD_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref["key"] in one(full, "Secret", ref["name"])["stringData"]


def test_the_extender_is_reachable_without_a_token_where_it_is_installed(full, base):
    # kube-scheduler cannot send a token: the overlay that installs the extender opens /scheduler/*.
    assert one(base, "ConfigMap", "laggard-collector-config")["data"]["LAGGARD_SCHEDULER_PUBLIC"] == "false"
    assert one(full, "ConfigMap", "laggard-collector-config")["data"]["LAGGARD_SCHEDULER_PUBLIC"] == "true"


# --- monitoring -------------------------------------------------------------------------------


def test_monitoring_copies_are_in_sync():
    proc = subprocess.run([sys.executable, str(KUBE / "monitoring" / "sync.py"), "--check"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_dashboards_are_configmaps_for_the_grafana_sidecar():
    objects = render("monitoring")
    dashboards = {}
    for cm in (o for o in objects if o["kind"] == "ConfigMap"):
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        dashboards.update(cm["data"])
    sources = {p.name: p.read_text() for p in (REPO / "dashboards").glob("*.json")}
    assert sources and dashboards == sources


def test_prometheus_rule_carries_the_alert_rules():
    rule = one(render("monitoring"), "PrometheusRule", "laggard")
    source = yaml.safe_load((REPO / "deploy" / "prometheus" / "laggard-alerts.yml").read_text())
    assert rule["spec"]["groups"] == source["groups"]


def test_service_monitor_scrapes_the_collector_as_job_laggard(full):
    monitor = one(full, "ServiceMonitor", "laggard-collector")
    service = one(full, "Service", "laggard-collector")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    assert {"action": "replace", "targetLabel": "job", "replacement": "laggard"} in endpoint["relabelings"]
    # /metrics wants a read token unless the collector serves it publicly.
    if one(full, "ConfigMap", "laggard-collector-config")["data"].get("LAGGARD_METRICS_PUBLIC") != "true":
        credentials = endpoint["authorization"]["credentials"]
        assert credentials["key"] in one(full, "Secret", credentials["name"])["stringData"]
