"""kube-scheduler's HTTP extender protocol (k8s.io/kube-scheduler/extender/v1), on hints.

The Go types carry no JSON tags, so the wire keys are the Go field names:

  ExtenderArgs          {"Pod": v1.Pod, "Nodes": v1.NodeList | null, "NodeNames": [string] | null}
  ExtenderFilterResult  {"Nodes": v1.NodeList | null, "NodeNames": [string] | null,
                         "FailedNodes": {node: reason}, "FailedAndUnresolvableNodes": {node: reason},
                         "Error": string}
  HostPriorityList      [{"Host": string, "Score": int 0..MaxExtenderPriority (10)}]

With nodeCacheCapable: true kube-scheduler sends NodeNames (Nodes null) and reads NodeNames back;
otherwise it sends the full Nodes list and reads Nodes back. The reply uses the form the request
used. Go's encoding/json matches object keys to fields case-insensitively (Unicode simple
folding; for a repeated key the last one wins), and so does this decoder, for the extender keys
and for the Kubernetes objects' own keys (items, metadata, name); replies use the exact names.

Nodes with no hint (unknown to Laggard) pass the filter and get unknown_node_score.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from server.hints.settings import HintSettings

MAX_EXTENDER_PRIORITY = 10
ARGS_FIELDS = ("Pod", "Nodes", "NodeNames")


class ProtocolError(ValueError):
    def __init__(self, msg: str, loc: list[Any]):
        super().__init__(msg)
        self.loc = loc


def go_fields(obj: Mapping[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """The values of `obj` for Go struct `fields`, matched the way encoding/json does: an exact
    key or one equal under case folding; unknown keys are ignored; a later key overwrites."""
    folded = {f.casefold(): f for f in fields}
    out: dict[str, Any] = {}
    for key, value in obj.items():
        name = key if key in fields else folded.get(key.casefold())
        if name is not None:
            out[name] = value
    return out


def go_get(obj: Mapping[str, Any], field: str) -> Any:
    return go_fields(obj, (field,)).get(field)


@dataclass
class ExtenderArgs:
    pod: dict[str, Any] | None
    nodes: dict[str, Any] | None  # the NodeList as received
    node_items: list[dict[str, Any]] | None
    node_names: list[str] | None

    def candidates(self) -> list[str]:
        """Candidate node names, in the order kube-scheduler sent them."""
        if self.node_names is not None:
            return list(self.node_names)
        return [item_name(i) for i in self.node_items or ()]


def item_name(item: Mapping[str, Any]) -> str:
    meta = go_get(item, "metadata")
    name = go_get(meta, "name") if isinstance(meta, Mapping) else None
    return name if isinstance(name, str) else ""


def decode_args(body: Any) -> ExtenderArgs:
    if not isinstance(body, Mapping):
        raise ProtocolError("ExtenderArgs must be a JSON object", ["body"])
    f = go_fields(body, ARGS_FIELDS)
    pod = f.get("Pod")
    if pod is not None and not isinstance(pod, Mapping):
        raise ProtocolError("Pod must be an object", ["body", "Pod"])
    names = f.get("NodeNames")
    if names is not None and (not isinstance(names, list) or not all(isinstance(n, str) for n in names)):
        raise ProtocolError("NodeNames must be a list of strings", ["body", "NodeNames"])
    nodes = f.get("Nodes")
    items = None
    if nodes is not None:
        if not isinstance(nodes, Mapping):
            raise ProtocolError("Nodes must be a NodeList object", ["body", "Nodes"])
        items = go_get(nodes, "items")
        if items is None:
            items = []
        if not isinstance(items, list) or not all(isinstance(i, Mapping) for i in items):
            raise ProtocolError("Nodes.items must be a list of Node objects", ["body", "Nodes", "items"])
    return ExtenderArgs(pod=pod, nodes=nodes, node_items=items, node_names=names)


def filter_result(args: ExtenderArgs, hints: Mapping[str, Mapping[str, Any]], cfg: HintSettings, *, error: str = "") -> dict[str, Any]:
    """ExtenderFilterResult: nodes whose action is in filter_actions fail, with the reason."""
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    blocked = set(cfg.filter_actions)
    for name in args.candidates():
        hint = hints.get(name)
        if hint is None or hint["action"] not in blocked:
            continue
        reason = f"laggard: {hint['action']}: {hint.get('text') or 'straggler'}"[:1024]
        (unresolvable if hint["action"] in cfg.unresolvable_actions else failed)[name] = reason
    result: dict[str, Any] = {"Nodes": None, "NodeNames": None, "FailedNodes": failed,
                              "FailedAndUnresolvableNodes": unresolvable, "Error": error}
    out = failed.keys() | unresolvable.keys()
    if args.node_names is not None:
        result["NodeNames"] = [n for n in args.node_names if n not in out]
    if args.nodes is not None:
        kept = [i for i in args.node_items or () if item_name(i) not in out]
        nodelist = {k: v for k, v in args.nodes.items() if k.casefold() != "items"}
        result["Nodes"] = {**nodelist, "items": kept}
    return result


def score(hint: Mapping[str, Any] | None, cfg: HintSettings) -> int:
    """0–10: capacity × 10 (rounded half up) for ok and rebalance nodes, 0 for avoid and drain,
    unknown_node_score for a node with no hint."""
    if hint is None:
        return cfg.unknown_node_score
    if hint["action"] in ("avoid", "drain"):
        return 0
    return max(0, min(MAX_EXTENDER_PRIORITY, int(float(hint["capacity"]) * MAX_EXTENDER_PRIORITY + 0.5)))


def prioritize_result(args: ExtenderArgs, hints: Mapping[str, Mapping[str, Any]], cfg: HintSettings) -> list[dict[str, Any]]:
    """HostPriorityList, one entry per candidate in the order received."""
    return [{"Host": name, "Score": score(hints.get(name), cfg)} for name in args.candidates()]
