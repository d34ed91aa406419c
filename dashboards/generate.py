"""Writes the Grafana dashboards (dashboards/*.json) from one description, so that every panel
uses the same datasource variable, template variables and conventions.

    python dashboards/generate.py          # rewrite the JSON files
    python dashboards/generate.py --check  # exit 1 if they differ from what this writes

Every PromQL expression here is evaluated against a real Prometheus scraping a collector fed by
a simulated fleet (tests/dashboards/test_dashboards.py), template variables substituted, and
must return data. The series are the collector's own (docs/observability.md); raw readings use
dcgm-exporter's names and labels (Hostname is the node, gpu the index).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DS = {"type": "prometheus", "uid": "${datasource}"}
C = 'cluster="$cluster"'
N = 'cluster="$cluster", node="$node"'
G = 'cluster="$cluster", node="$node", gpu="$gpu"'
J = 'cluster="$cluster", job_name=~"$job"'  # the job attributed to the GPUs (issue #15)
DN = 'cluster="$cluster", Hostname="$node"'  # dcgm-exporter's node label
DG = 'cluster="$cluster", Hostname="$node", gpu="$gpu"'
RI = "$__rate_interval"


def target(expr: str, legend: str = "", *, instant: bool = False, ref: str = "A", fmt: str | None = None) -> dict:
    t = {"refId": ref, "datasource": DS, "expr": expr, "legendFormat": legend or "__auto", "range": not instant, "instant": instant}
    if fmt:
        t["format"] = fmt
    return t


def panel(kind: str, title: str, targets: list[dict], *, w: int = 12, h: int = 8, unit: str | None = None, desc: str = "",
          options: dict | None = None, min_: float | None = None, max_: float | None = None) -> dict:
    for i, t in enumerate(targets):
        t["refId"] = chr(ord("A") + i)
    defaults: dict = {}
    if unit:
        defaults["unit"] = unit
    if min_ is not None:
        defaults["min"] = min_
    if max_ is not None:
        defaults["max"] = max_
    p = {"type": kind, "title": title, "datasource": DS, "targets": targets, "gridPos": {"w": w, "h": h},
         "fieldConfig": {"defaults": defaults, "overrides": []}, "options": options or {}}
    if desc:
        p["description"] = desc
    return p


def stat(title: str, expr: str, *, unit: str | None = None, desc: str = "", w: int = 6, legend: str = "") -> dict:
    return panel("stat", title, [target(expr, legend, instant=True)], w=w, h=4, unit=unit, desc=desc,
                 options={"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}, "colorMode": "value"})


def series(title: str, *targets_: tuple[str, str], unit: str | None = None, desc: str = "", w: int = 12, **kw) -> dict:
    return panel("timeseries", title, [target(expr, legend) for expr, legend in targets_], unit=unit, desc=desc, w=w, **kw)


def heatmap(title: str, expr: str, legend: str, *, unit: str, desc: str) -> dict:
    # One row per series (node/gpu), coloured by value: no bucketing ("calculate": false).
    return panel("heatmap", title, [target(expr, legend, fmt="time_series")], w=24, h=12, unit=unit, desc=desc, options={
        "calculate": False, "yAxis": {"axisPlacement": "left"}, "rowsFrame": {"layout": "auto"},
        "color": {"mode": "scheme", "scheme": "RdYlGn", "reverse": unit == "celsius", "steps": 64},
        "cellGap": 1, "tooltip": {"show": True, "yHistogram": False},
    })


def variables(*names: str) -> dict:
    out = [{"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus", "current": {}, "hide": 0}]
    queries = {
        "cluster": "label_values(laggard_nodes_reporting, cluster)",
        "node": 'label_values(laggard_node_last_seen_timestamp_seconds{cluster="$cluster"}, node)',
        "gpu": 'label_values(laggard_gpu_sm_clock_ratio{cluster="$cluster", node="$node"}, gpu)',
        "job": 'label_values(laggard_gpu_capacity_ratio{cluster="$cluster"}, job_name)',
    }
    for name in names:
        out.append({"name": name, "label": name.capitalize() if name != "gpu" else "GPU", "type": "query", "datasource": DS,
                    "query": {"query": queries[name], "refId": f"var-{name}"}, "definition": queries[name], "refresh": 2,
                    "sort": 3 if name == "gpu" else 1, "includeAll": False, "multi": False, "current": {}, "hide": 0})
    return {"list": out}


def layout(panels: list[dict]) -> list[dict]:
    """Left to right, top to bottom, 24 columns."""
    x = y = row_h = 0
    for i, p in enumerate(panels, start=1):
        w, h = p["gridPos"]["w"], p["gridPos"]["h"]
        if x + w > 24:
            x, y, row_h = 0, y + row_h, 0
        p["gridPos"] = {"x": x, "y": y, "w": w, "h": h}
        p["id"] = i
        x += w
        row_h = max(row_h, h)
    return panels


def dashboard(uid: str, title: str, description: str, panels: list[dict], var_names: tuple[str, ...], *, annotations: list[dict] = (),
              links: bool = True) -> dict:
    anns = [{"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True, "hide": True,
             "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard"}, *annotations]
    return {
        "uid": uid, "title": title, "description": description, "tags": ["laggard", "gpu"], "timezone": "browser",
        "editable": True, "graphTooltip": 1, "schemaVersion": 39, "version": 1, "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"}, "templating": variables(*var_names), "annotations": {"list": anns},
        "links": [{"title": "Laggard", "type": "dashboards", "tags": ["laggard"], "asDropdown": True, "includeVars": True,
                   "keepTime": True}] if links else [],
        "panels": layout(panels),
    }


def fleet() -> dict:
    panels = [
        stat("Stragglers now", f"sum(laggard_straggler_active{{{C}}}) or vector(0)", desc="Open episodes in the cluster."),
        stat("Nodes reporting", f"sum(laggard_nodes_reporting{{{C}}})"),
        stat("Stale nodes", f"sum(laggard_nodes_stale{{{C}}})", desc="Known nodes with no sample for node_stale_after_s."),
        stat("Capacity lost", f"sum(1 - laggard_gpu_capacity_ratio{{{C}}})", unit="none",
             desc="GPU-equivalents lost to stragglers: the sum over GPUs of 1 - capacity."),
        panel("table", "Stragglers now", [target(f"laggard_straggler_active{{{C}}} > 0", instant=True, fmt="table")], w=24, h=8,
              options={"showHeader": True, "sortBy": [{"displayName": "severity"}]}),
        heatmap("SM clock ratio by node and GPU", f"laggard_gpu_sm_clock_ratio{{{C}}}", "{{node}} / {{gpu}}", unit="percentunit",
                desc="SM clock as a fraction of its maximum, per GPU (rows). A straggler shows as a cold cell among warm ones."),
        heatmap("GPU temperature by node and GPU", f"DCGM_FI_DEV_GPU_TEMP{{{C}}}", "{{Hostname}} / {{gpu}}", unit="celsius",
                desc="GPU temperature per GPU (rows)."),
        series("Capacity lost (GPU-equivalents)", (f"sum(1 - laggard_gpu_capacity_ratio{{{C}}})", "lost")),
        series("Stragglers by cause", (f"sum by (cause) (laggard_straggler_active{{{C}}})", "{{cause}}")),
        series("Episodes opened per hour", (f"sum by (cause) (increase(laggard_episodes_opened_total{{{C}}}[1h]))", "{{cause}}")),
        series("Node actions", (f"sum by (action) (laggard_node_action{{{C}}})", "{{action}}"),
               desc="Nodes per scheduling action (scheduler hints): ok, rebalance, avoid, drain."),
        series("XID events per hour", (f"sum by (xid) (increase(laggard_gpu_xid_errors_total{{{C}}}[1h]))", "XID {{xid}}"), w=24),
        *job_view(),
    ]
    return dashboard("laggard-fleet", "Laggard / Fleet overview", "Stragglers, capacity and health across one cluster; one job's below.",
                     panels, ("cluster", "job"))


def job_view() -> list[dict]:
    """One job's GPUs, its stragglers and the share of its throughput lost ($job: the job the
    agents attributed to the GPUs, docs/attribution.md)."""
    return [
        stat("Job: GPUs", f"count(laggard_gpu_capacity_ratio{{{J}}})", desc="GPUs the job runs on now."),
        stat("Job: stragglers now", f"sum(laggard_straggler_active{{{J}}}) or vector(0)", desc="Open episodes on the job's GPUs."),
        stat("Job: throughput lost", f"1 - avg(laggard_gpu_capacity_ratio{{{J}}})", unit="percentunit",
             desc="Share of the job's GPU throughput lost to stragglers: the mean over its GPUs of 1 - capacity "
                  "(GPU-equivalents lost / GPUs)."),
        stat("Job: lost in lockstep", f"1 - min(laggard_gpu_capacity_ratio{{{J}}})", unit="percentunit",
             desc="The same if every step waits for the slowest GPU (synchronous data parallel): 1 - its lowest capacity."),
        panel("table", "Job: stragglers now", [target(f"laggard_straggler_active{{{J}}} > 0", instant=True, fmt="table")], w=24, h=6,
              options={"showHeader": True, "sortBy": [{"displayName": "severity"}]}),
        series("Job: throughput lost", (f"1 - avg(laggard_gpu_capacity_ratio{{{J}}})", "mean"),
               (f"1 - min(laggard_gpu_capacity_ratio{{{J}}})", "lockstep"), unit="percentunit", min_=0),
        series("Job: SM clock ratio of its GPUs", (f"laggard_gpu_sm_clock_ratio{{{J}}}", "{{node}} / {{gpu}}"), unit="percentunit"),
    ]


def straggler() -> dict:
    episodes = {
        "name": "Straggler episodes", "datasource": DS, "enable": True, "iconColor": "red",
        "expr": f"laggard_straggler_active{{{G}}} > 0", "step": "15s", "titleFormat": "{{cause}} ({{severity}})",
        "tagKeys": "cause,severity", "useValueForTime": False,
    }
    panels = [
        series("SM clock ratio: this GPU against its peers' median",
               (f"laggard_gpu_sm_clock_ratio{{{G}}}", "GPU {{gpu}}"), (f"quantile(0.5, laggard_gpu_sm_clock_ratio{{{C}}})", "peer median"),
               unit="percentunit", w=24, h=9),
        series("Deviation from peers", (f"laggard_gpu_peer_deviation_ratio{{{G}}}", "deviation"), unit="percentunit",
               desc="SM clock ratio against the median of the busy peers (same cluster, model and job), minus 1."),
        series("Capacity", (f"laggard_gpu_capacity_ratio{{{G}}}", "capacity"), unit="percentunit", min_=0, max_=1),
        series("Temperature against the peers' median", (f"DCGM_FI_DEV_GPU_TEMP{{{DG}}}", "GPU {{gpu}}"),
               (f"quantile(0.5, DCGM_FI_DEV_GPU_TEMP{{{C}}})", "peer median"), unit="celsius"),
        series("Power against its limit", (f"DCGM_FI_DEV_POWER_USAGE{{{DG}}}", "draw"), (f"DCGM_FI_DEV_ENFORCED_POWER_LIMIT{{{DG}}}", "limit"),
               (f"quantile(0.5, DCGM_FI_DEV_POWER_USAGE{{{C}}})", "peer median draw"), unit="watt"),
        series("Clock throttle reasons (bitmask)", (f"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{{{DG}}}", "reasons"),
               desc="NVML clocks-event reasons: 0x4 SW power cap, 0x8 HW slowdown, 0x20 SW thermal, 0x40 HW thermal, 0x80 HW power brake."),
        panel("state-timeline", "Episodes", [target(f"laggard_straggler_active{{{G}}}", "{{cause}} {{severity}}")], w=12, h=8),
    ]
    return dashboard("laggard-straggler", "Laggard / Straggler detail", "One GPU against its peers, with its episodes as annotations.",
                     panels, ("cluster", "node", "gpu"), annotations=[episodes])


def node() -> dict:
    panels = [
        stat("Action", f"laggard_node_action{{{N}}} == 1", legend="{{action}}", desc="The scheduler hint for this node."),
        stat("Capacity", f"laggard_node_capacity_ratio{{{N}}}", unit="percentunit"),
        stat("Open episodes", f"sum(laggard_straggler_active{{{N}}}) or vector(0)"),
        stat("Last sample", f"time() - laggard_node_last_seen_timestamp_seconds{{{N}}}", unit="s", desc="Age of the node's newest sample."),
        series("SM clock", (f"DCGM_FI_DEV_SM_CLOCK{{{DN}}}", "GPU {{gpu}}"), unit="rotmhz"),
        series("SM clock ratio", (f"laggard_gpu_sm_clock_ratio{{{N}}}", "GPU {{gpu}}"), unit="percentunit"),
        series("GPU temperature", (f"DCGM_FI_DEV_GPU_TEMP{{{DN}}}", "GPU {{gpu}}"), unit="celsius"),
        series("Memory temperature", (f"DCGM_FI_DEV_MEMORY_TEMP{{{DN}}}", "GPU {{gpu}}"), unit="celsius"),
        series("Power against limit", (f"DCGM_FI_DEV_POWER_USAGE{{{DN}}} / DCGM_FI_DEV_ENFORCED_POWER_LIMIT{{{DN}}}", "GPU {{gpu}}"),
               unit="percentunit"),
        series("Clock throttle reasons (bitmask)", (f"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{{{DN}}}", "GPU {{gpu}}")),
        series("Utilisation", (f"DCGM_FI_DEV_GPU_UTIL{{{DN}}}", "GPU {{gpu}}"), unit="percent"),
        series("Tensor pipe activity", (f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{DN}}}", "GPU {{gpu}}"), unit="percentunit",
               desc="Share of cycles any tensor pipe was active between two agent samples (NVML GPM: Hopper and newer; "
                    "empty on older GPUs)."),
        series("NVLink throughput", (f"rate(DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{{{DN}}}[{RI}])", "GPU {{gpu}}"), unit="Bps"),
        series("NVLink links up", (f"laggard_gpu_nvlink_links_up{{{N}}}", "GPU {{gpu}}"), (f"max(laggard_gpu_nvlink_links{{{N}}})", "links")),
        series("NVLink CRC errors", (f"rate(laggard_gpu_nvlink_crc_errors_total{{{N}}}[{RI}])", "GPU {{gpu}}"), unit="cps"),
        series("PCIe link", (f"DCGM_FI_DEV_PCIE_LINK_GEN{{{DN}}}", "gen GPU {{gpu}}"), (f"DCGM_FI_DEV_PCIE_LINK_WIDTH{{{DN}}}", "x GPU {{gpu}}"),
               (f"max(DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH{{{DN}}})", "max width"), (f"max(DCGM_FI_DEV_PCIE_MAX_LINK_GEN{{{DN}}})", "max gen")),
        series("PCIe replays", (f"rate(DCGM_FI_DEV_PCIE_REPLAY_COUNTER{{{DN}}}[{RI}])", "GPU {{gpu}}"), unit="cps"),
        series("IB ports up", (f"laggard_nic_port_up{{{N}}}", "{{device}}/{{port}}")),
        series("IB throughput", (f"rate(laggard_nic_transmit_bytes_total{{{N}}}[{RI}])", "tx {{device}}/{{port}}"),
               (f"rate(laggard_nic_receive_bytes_total{{{N}}}[{RI}])", "rx {{device}}/{{port}}"), unit="Bps"),
        series("IB errors", (f"rate(laggard_nic_symbol_errors_total{{{N}}}[{RI}])", "symbol {{device}}/{{port}}"),
               (f"rate(laggard_nic_receive_errors_total{{{N}}}[{RI}])", "receive {{device}}/{{port}}"),
               (f"increase(laggard_nic_link_downed_total{{{N}}}[{RI}])", "link down {{device}}/{{port}}"), unit="cps"),
        series("IB transmit wait", (f"rate(laggard_nic_transmit_wait_ticks_total{{{N}}}[{RI}])", "{{device}}/{{port}}"),
               desc="Ticks per second with data to send and no credits: congestion.", w=24),
    ]
    return dashboard("laggard-node", "Laggard / Node drill-down", "Every GPU and IB port of one node.", panels, ("cluster", "node"))


def collector() -> dict:
    job = 'job="laggard"'
    panels = [
        stat("Collectors up", f"sum(up{{{job}}})"),
        stat("Detection lag", "max(laggard_detection_lag_seconds)", unit="s",
             desc="Now minus the sample time the detector has judged up to (the worst cluster)."),
        stat("Undelivered alerts", "sum(laggard_alert_deliveries_pending) or vector(0)"),
        stat("Scrape duration", f"max(scrape_duration_seconds{{{job}}})", unit="s"),
        series("Samples committed", ("sum by (cluster) (rate(laggard_ingest_samples_total[$__rate_interval]))", "{{cluster}}"), unit="ops",
               desc="Node samples per second (each holds every GPU and port of its node)."),
        series("Ingest latency", ("histogram_quantile(0.5, sum by (le) (rate(laggard_ingest_request_duration_seconds_bucket[$__rate_interval])))",
                                  "p50"),
               ("histogram_quantile(0.99, sum by (le) (rate(laggard_ingest_request_duration_seconds_bucket[$__rate_interval])))", "p99"),
               unit="s"),
        series("Rejected requests", ("sum by (code) (rate(laggard_ingest_rejected_requests_total[$__rate_interval]))", "HTTP {{code}}"),
               unit="reqps"),
        series("Nodes", ("sum by (cluster) (laggard_nodes_reporting)", "reporting {{cluster}}"),
               ("sum by (cluster) (laggard_nodes_stale)", "stale {{cluster}}")),
        series("Detection lag", ("laggard_detection_lag_seconds", "{{cluster}}"), unit="s"),
        series("Detection backlog", ("laggard_detection_backlog_batches", "batches"), desc="Committed batches the detector has not read."),
        series("Alert notifications", ("sum by (receiver, result) (rate(laggard_alert_notifications_total[$__rate_interval]))",
                                       "{{receiver}} {{result}}"), unit="reqps"),
        series("Undelivered alerts", ("laggard_alert_deliveries_pending", "{{receiver}}"),
               ("laggard_alert_oldest_pending_age_seconds", "oldest age {{receiver}} (s)")),
        series("Memory", (f"process_resident_memory_bytes{{{job}}}", "{{instance}}"), unit="bytes"),
        series("CPU", (f"rate(process_cpu_seconds_total{{{job}}}[$__rate_interval])", "{{instance}}"), unit="percentunit"),
    ]
    return dashboard("laggard-collector", "Laggard / Collector health", "Ingest, detection and alert delivery of the collectors.", panels, ())


DASHBOARDS = {"fleet-overview.json": fleet, "straggler-detail.json": straggler, "node-drilldown.json": node,
              "collector-health.json": collector}


def render_all() -> dict[str, str]:
    return {name: json.dumps(build(), indent=2, sort_keys=False) + "\n" for name, build in DASHBOARDS.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="compare instead of writing")
    args = p.parse_args()
    stale = []
    for name, text in render_all().items():
        path = HERE / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"out of date (run python dashboards/generate.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
