"""`laggard k8s-sync`: keep a taint and a node condition in step with the hints.

For every Kubernetes node whose name Laggard knows:
- taint `laggard.io/straggler=<cause>` (the cause of its gravest reason) with effect
  PreferNoSchedule while the hint is avoid and NoSchedule while it is drain (hints.taint_effects);
  no such taint otherwise. Only taints with that key are ever added, changed or removed.
- condition `LaggardStraggler` (hints.condition_type): True (reason Rebalance / Avoid / Drain)
  while the hint is not ok, False (NoStraggler) when it is. Nodes Laggard does not know lose the
  taint, and a condition left on them turns Unknown (NoHints).

Writes go through the official `kubernetes` client:
- taints: PATCH /api/v1/nodes/{name}, strategic merge patch
  {"metadata": {"resourceVersion": ...}, "spec": {"taints": [...]}}. spec.taints has no merge
  key (the list is replaced whole), so the patch carries every taint of the node — the foreign
  ones unchanged — and the resourceVersion makes the API server refuse it (409) if the node
  changed since it was read; the node is then read again and the plan redone.
- condition: PATCH /api/v1/nodes/{name}/status, strategic merge patch
  {"status": {"conditions": [ours]}}: conditions merge by `type`, so the others stay untouched.
A change is written only when something differs, so a steady fleet costs one LIST per run.
Dry-run (the default) prints the plan and writes nothing.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from server.hints.render import by_node_name
from server.hints.settings import HintSettings

log = logging.getLogger(__name__)
STRATEGIC = "application/strategic-merge-patch+json"
CONDITION_REASONS = {"ok": "NoStraggler", "rebalance": "Rebalance", "avoid": "Avoid", "drain": "Drain"}
_LABEL_VALUE_BAD = re.compile(r"[^A-Za-z0-9_.-]")


def _taint_value(cause: str | None) -> str:
    value = _LABEL_VALUE_BAD.sub("_", cause or "unknown")[:63].strip("_.-")
    return value or "unknown"


@dataclass
class NodePlan:
    name: str
    resource_version: str | None
    taints_before: list[dict[str, Any]]
    taints_after: list[dict[str, Any]] | None = None  # None: leave the taints alone
    condition: dict[str, Any] | None = None  # None: leave the condition alone
    notes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.taints_after is not None or self.condition is not None

    def describe(self, cfg: HintSettings) -> list[str]:
        lines = []
        if self.taints_after is not None:
            before = {_taint_text(t) for t in self.taints_before if t.get("key") == cfg.taint_key}
            after = {_taint_text(t) for t in self.taints_after if t.get("key") == cfg.taint_key}
            lines += [f"node {self.name}: remove taint {t}" for t in sorted(before - after)]
            lines += [f"node {self.name}: add taint {t}" for t in sorted(after - before)]
        if self.condition is not None:
            c = self.condition
            lines.append(f"node {self.name}: set condition {c['type']}={c['status']} ({c['reason']}): {c['message']}")
        return lines


def _taint_text(t: Mapping[str, Any]) -> str:
    value = t.get("value")
    return f"{t.get('key')}{'=' + value if value else ''}:{t.get('effect')}"


def plan_node(node: Mapping[str, Any], hint: Mapping[str, Any] | None, cfg: HintSettings, *, now: str) -> NodePlan:
    """What to change on one Node (the API object as JSON) so it matches its hint."""
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    taints = list(spec.get("taints") or [])
    plan = NodePlan(name=meta.get("name", ""), resource_version=meta.get("resourceVersion"), taints_before=taints)

    owned = [t for t in taints if t.get("key") == cfg.taint_key]
    desired: list[dict[str, Any]] = []
    if hint is not None and hint["action"] in cfg.taint_effects:
        desired = [{"key": cfg.taint_key, "value": _taint_value(hint.get("cause")), "effect": cfg.taint_effects[hint["action"]]}]
    if [_taint_key(t) for t in owned] != [_taint_key(t) for t in desired]:
        plan.taints_after = [t for t in taints if t.get("key") != cfg.taint_key] + desired

    conditions = (node.get("status") or {}).get("conditions") or []
    current = next((c for c in conditions if c.get("type") == cfg.condition_type), None)
    if hint is None:
        if current is None or current.get("status") == "Unknown":
            return plan
        status, reason, message = "Unknown", "NoHints", "laggard has no hints for this node"
    else:
        status = "False" if hint["action"] == "ok" else "True"
        reason = CONDITION_REASONS[hint["action"]]
        message = "no straggler" if hint["action"] == "ok" else f"{hint['action']} (capacity {hint['capacity']:.2f}): {hint['text']}"
        message = " ".join(message.split())[:1024]
    if current is None or (current.get("status"), current.get("reason"), current.get("message")) != (status, reason, message):
        transition = now if current is None or current.get("status") != status else current.get("lastTransitionTime") or now
        plan.condition = {"type": cfg.condition_type, "status": status, "reason": reason, "message": message,
                          "lastHeartbeatTime": now, "lastTransitionTime": transition}
    return plan


def _taint_key(t: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    return t.get("key"), t.get("value") or "", t.get("effect")


def plan_all(nodes: list[Mapping[str, Any]], doc: Mapping[str, Any], cfg: HintSettings, *, now: str | None = None) -> list[NodePlan]:
    hints = by_node_name(doc)
    now = now or utc_now()
    return [plan_node(n, hints.get((n.get("metadata") or {}).get("name", "")), cfg, now=now) for n in nodes]


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- talking to the API server ------------------------------------------------------------


class NoCluster(Exception):
    """No API server to talk to: not in a pod, and no usable kubeconfig."""


def make_api(*, kube_api: str | None = None, kubeconfig: str | None = None, context: str | None = None):
    """CoreV1Api on: an explicit URL without credentials (kubectl proxy, tests), the
    in-cluster service account, or a kubeconfig; NoCluster when none of them is there."""
    from kubernetes import client, config

    if kube_api:
        return client.CoreV1Api(client.ApiClient(client.Configuration(host=kube_api.rstrip("/"))))
    if kubeconfig is None and context is None:
        try:
            config.load_incluster_config()
            return client.CoreV1Api()
        except config.ConfigException:
            pass
    try:
        config.load_kube_config(config_file=kubeconfig, context=context)
    except (config.ConfigException, OSError) as exc:
        raise NoCluster(f"no Kubernetes API server: not running in a pod, and no usable kubeconfig ({exc}); "
                        "give --kubeconfig, --context or --kube-api") from None
    return client.CoreV1Api()


def _json(resp) -> dict[str, Any]:
    data = resp.data
    return json.loads(data.decode() if isinstance(data, bytes) else data)


def list_nodes(api, *, selector: str | None = None) -> list[dict[str, Any]]:
    kwargs = {"label_selector": selector} if selector else {}
    return _json(api.list_node(_preload_content=False, **kwargs)).get("items") or []


def apply_plan(api, plan: NodePlan, hint: Mapping[str, Any] | None, cfg: HintSettings, *, retries: int = 3) -> NodePlan:
    """Write one node's plan; on a resourceVersion conflict re-read the node and re-plan."""
    from kubernetes.client.exceptions import ApiException

    for attempt in range(retries + 1):
        if plan.taints_after is not None:
            body = {"metadata": {"resourceVersion": plan.resource_version}, "spec": {"taints": plan.taints_after}}
            try:
                api.patch_node(plan.name, body, _content_type=STRATEGIC, _preload_content=False)
            except ApiException as exc:
                if exc.status != 409 or attempt == retries:
                    raise
                log.info("node %s changed while being updated; reading it again", plan.name)
                fresh = _json(api.read_node(plan.name, _preload_content=False))
                plan = plan_node(fresh, hint, cfg, now=utc_now())
                continue
        if plan.condition is not None:
            api.patch_node_status(plan.name, {"status": {"conditions": [plan.condition]}}, _content_type=STRATEGIC, _preload_content=False)
        return plan
    return plan


def sync_once(api, doc: Mapping[str, Any], cfg: HintSettings, *, apply: bool, selector: str | None = None,
              out=print) -> list[NodePlan]:
    nodes = list_nodes(api, selector=selector)
    hints = by_node_name(doc)
    plans = [p for p in plan_all(nodes, doc, cfg) if p.changed]
    from kubernetes.client.exceptions import ApiException

    failed = []
    for plan in plans:
        for line in plan.describe(cfg):
            out(line if apply else f"(dry run) {line}")
        if apply:
            try:
                apply_plan(api, plan, hints.get(plan.name), cfg)
            except ApiException as exc:  # one node failing (deleted, forbidden) does not stop the rest
                failed.append(plan.name)
                out(f"node {plan.name}: FAILED: {exc.status} {exc.reason}")
    known = sum(1 for n in nodes if (n.get("metadata") or {}).get("name") in hints)
    verb = "applied" if apply else "planned (dry run; --apply to act)"
    out(f"{len(nodes)} Kubernetes nodes, {known} with hints: {len(plans)} node{'s' if len(plans) != 1 else ''} to change, {verb}"
        + (f"; {len(failed)} failed" if failed else ""))
    if failed:
        raise SyncError(f"{len(failed)} node(s) could not be updated: {', '.join(failed)}")
    return plans


class SyncError(RuntimeError):
    pass
