"""Alerts as Alertmanager shapes them.

- alert_for_episode(): one alert of an episode: labels (alertname, cluster, node, gpu, cause,
  severity; device and port for an IB/RoCE port), annotations (summary, evidence), startsAt,
  endsAt, status and a fingerprint.
- notification(): Alertmanager's webhook payload, version "4", for a group of alerts.
- postable(): the body item of Alertmanager's POST /api/v2/alerts.

The fingerprint is Alertmanager's own (the label set's 64-bit FNV-1a, as Prometheus computes
it), so it is the same on every delivery, every retry and every collector process, the resolve
of an alert carries the fingerprint of its firing, and a receiver that deduplicates on it pairs
Laggard's webhooks with what an Alertmanager reports for the same alert.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

ALERTNAME = "LaggardStraggler"
ZERO_TIME = "0001-01-01T00:00:00Z"  # Alertmanager's "not set" endsAt of a firing alert
GROUP_LABELS = ("cluster", "cause")
EVIDENCE_MAX_CHARS = 4000


def rfc3339(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_rfc3339(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# Prometheus' label-set fingerprint: 64-bit FNV-1a over the names in sorted order, each name and
# value followed by the byte 0xff, printed as 16 hex digits.
_FNV64_OFFSET = 14695981039346656037
_FNV64_PRIME = 1099511628211
_MASK64 = 2**64 - 1


def fingerprint(labels: Mapping[str, str]) -> str:
    h = _FNV64_OFFSET
    for name in sorted(labels):
        for part in (name, str(labels[name])):
            for byte in part.encode() + b"\xff":
                h = ((h ^ byte) * _FNV64_PRIME) & _MASK64
    return f"{h:016x}"


def episode_labels(ep: Mapping[str, Any], *, severity: str | None = None) -> dict[str, str]:
    labels = {"alertname": ALERTNAME, "cluster": ep["cluster"], "node": ep["node"]}
    if ep.get("gpu") is not None:
        labels["gpu"] = str(ep["gpu"])
    entity = ep.get("entity") or ""
    if entity.startswith("nic:"):
        # nic:<cluster>/<node>/<device>/<port>; cluster and node names may hold '/', device and port do not.
        device, port = entity.rsplit("/", 2)[-2:]
        labels["device"], labels["port"] = device, port
    labels["cause"] = ep["cause"]
    labels["severity"] = severity or ep["severity"]
    # The job the straggler slows, as the Prometheus rules' alerts carry it (job_name: `job` is
    # the scrape job's label there), so one Alertmanager route serves both alert paths.
    job = (ep.get("evidence") or {}).get("job")
    if job:
        labels["job_name"] = str(job)
    return labels


def alert_for_episode(ep: Mapping[str, Any], *, status: str, severity: str | None = None, ends_at: float | None = None) -> dict[str, Any]:
    """The alert (without generatorURL, which depends on the receiving side's settings)."""
    labels = episode_labels(ep, severity=severity)
    evidence = json.dumps(ep.get("evidence") or {}, sort_keys=True, separators=(",", ":"), default=str)
    if len(evidence) > EVIDENCE_MAX_CHARS:
        evidence = evidence[: EVIDENCE_MAX_CHARS - 1] + "…"
    annotations = {"summary": ep.get("summary") or "", "evidence": evidence, "episode_id": str(ep["id"])}
    if ep.get("uuid"):
        annotations["uuid"] = ep["uuid"]
    return {
        "status": status,
        "labels": labels,
        "annotations": annotations,
        "startsAt": rfc3339(ep["onset"]),
        "endsAt": rfc3339(ends_at) if ends_at is not None else ZERO_TIME,
        "fingerprint": fingerprint(labels),
    }


def generator_url(alert: Mapping[str, Any], *, external_url: str, dashboard_url: str | None = None) -> str:
    """Where a person clicking the alert lands: the straggler-detail dashboard on the GPU when a
    Grafana URL is configured, else the episode's page on the collector's status page (/ui)."""
    labels = alert["labels"]
    if dashboard_url:
        query = {"var-cluster": labels["cluster"], "var-node": labels["node"]}
        if "gpu" in labels:
            query["var-gpu"] = labels["gpu"]
        return f"{dashboard_url.rstrip('/')}/d/laggard-straggler/laggard-straggler-detail?{urlencode(query)}"
    episode = alert.get("annotations", {}).get("episode_id")
    if episode:
        return f"{external_url.rstrip('/')}/ui/episodes/{episode}"
    query = {"cluster": labels["cluster"], "node": labels["node"]} | ({"gpu": labels["gpu"]} if "gpu" in labels else {})
    return f"{external_url.rstrip('/')}/ui/stragglers?{urlencode(query)}"


def group_key(cluster: str, cause: str) -> str:
    return f"{cluster}\x1f{cause}"


def notification(alerts: Sequence[Mapping[str, Any]], *, receiver: str, external_url: str, dashboard_url: str | None = None,
                 truncated: int = 0) -> dict[str, Any]:
    """Alertmanager's webhook payload (version 4) for one group (one cluster, one cause)."""
    out_alerts = []
    for a in alerts:
        item = {k: a[k] for k in ("status", "labels", "annotations", "startsAt", "endsAt")}
        item["generatorURL"] = generator_url(a, external_url=external_url, dashboard_url=dashboard_url)
        item["fingerprint"] = a["fingerprint"]
        out_alerts.append(item)
    common_labels = _common([a["labels"] for a in alerts])
    group_labels = {k: common_labels[k] for k in GROUP_LABELS if k in common_labels}
    matchers = ", ".join(f'{k}="{v}"' for k, v in sorted(group_labels.items()))
    return {
        "version": "4",
        "groupKey": f"{{}}:{{{matchers}}}",
        "truncatedAlerts": truncated,
        "status": "firing" if any(a["status"] == "firing" for a in alerts) else "resolved",
        "receiver": receiver,
        "groupLabels": group_labels,
        "commonLabels": common_labels,
        "commonAnnotations": _common([a["annotations"] for a in alerts]),
        "externalURL": external_url,
        "alerts": out_alerts,
    }


def postable(alert: Mapping[str, Any], *, external_url: str, dashboard_url: str | None = None, ends_at: float | None = None) -> dict[str, Any]:
    """One item of Alertmanager's POST /api/v2/alerts body. A resolved alert carries its endsAt;
    a firing one an endsAt the caller picks (Alertmanager resolves it then unless re-posted)."""
    item: dict[str, Any] = {
        "labels": dict(alert["labels"]),
        "annotations": dict(alert["annotations"]),
        "startsAt": alert["startsAt"],
        "generatorURL": generator_url(alert, external_url=external_url, dashboard_url=dashboard_url),
    }
    if alert["status"] == "resolved" and alert["endsAt"] != ZERO_TIME:
        item["endsAt"] = alert["endsAt"]
    elif ends_at is not None:
        item["endsAt"] = rfc3339(ends_at)
    return item


def _common(maps: Sequence[Mapping[str, str]]) -> dict[str, str]:
    if not maps:
        return {}
    first = maps[0]
    return {k: v for k, v in first.items() if all(m.get(k) == v for m in maps[1:])}
