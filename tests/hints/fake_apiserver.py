"""A local stand-in for the Kubernetes API server, on 127.0.0.1: enough of GET/PATCH nodes and
PATCH nodes/{name}/status to serve the official client, answering as the real one does
(Status objects on errors, 409 on a stale resourceVersion, 415 on a patch type it does not
take), and recording every request for the tests to assert on."""

from __future__ import annotations

import copy
import json
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlparse

from tests.hints.loopback import LoopbackServer

PATCH_TYPES = ("application/strategic-merge-patch+json", "application/merge-patch+json", "application/json-patch+json")


def node(name: str, *, taints: list[dict] | None = None, conditions: list[dict] | None = None, labels: dict | None = None) -> dict:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "1", "labels": labels or {"kubernetes.io/hostname": name}},
        "spec": {"podCIDR": "10.0.0.0/24", **({"taints": taints} if taints is not None else {})},
        "status": {"conditions": conditions if conditions is not None else [
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
             "lastHeartbeatTime": "2025-01-01T00:00:00Z", "lastTransitionTime": "2025-01-01T00:00:00Z"}]},
    }


class FakeApiServer(LoopbackServer):
    def __init__(self, nodes: list[dict]):
        self.nodes = {n["metadata"]["name"]: copy.deepcopy(n) for n in nodes}
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.conflicts: dict[str, int] = {}  # node → how many PATCHes to refuse with 409 (a concurrent writer)
        self.concurrent_taint: dict | None = None  # added by the "other writer" when it causes a conflict
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                fake._handle(self, "GET")

            def do_PATCH(self):
                fake._handle(self, "PATCH")

        self._serve(Handler)

    def writes(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["method"] != "GET"]

    # --- request handling ---------------------------------------------------------------

    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        url = urlparse(h.path)
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        with self.lock:
            self.requests.append({"method": method, "path": url.path, "query": parse_qs(url.query),
                                  "content_type": h.headers.get("Content-Type"), "body": body})
            status, payload = self._route(method, url.path, parse_qs(url.query), h.headers.get("Content-Type"), body)
        data = json.dumps(payload).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _route(self, method, path, query, content_type, body):
        parts = path.strip("/").split("/")
        if parts[:3] != ["api", "v1", "nodes"]:
            return _status(404, "NotFound", f"the server could not find the requested resource ({path})")
        if method == "GET" and len(parts) == 3:
            return 200, self._node_list(query)
        name = parts[3] if len(parts) > 3 else ""
        if name not in self.nodes:
            return _status(404, "NotFound", f'nodes "{name}" not found')
        current = self.nodes[name]
        if method == "GET" and len(parts) == 4:
            return 200, current
        if method != "PATCH":
            return _status(405, "MethodNotAllowed", "method not allowed")
        refused = _refused_patch_type(content_type)
        if refused is not None:
            return refused
        if len(parts) == 4:  # PATCH nodes/{name}: metadata + spec
            return self._patch_node(name, current, body)
        if len(parts) == 5 and parts[4] == "status":
            return self._patch_node_status(current, body)
        return _status(404, "NotFound", "not found")

    def _node_list(self, query) -> dict:
        items = list(self.nodes.values())
        selector = (query.get("labelSelector") or [None])[0]
        if selector:
            k, _, v = selector.partition("=")
            items = [n for n in items if n["metadata"]["labels"].get(k) == v]
        return {"kind": "NodeList", "apiVersion": "v1", "metadata": {"resourceVersion": "100"}, "items": items}

    def _patch_node(self, name: str, current: dict, body):
        if self.conflicts.get(name):
            self._concurrent_write(name, current)
        rv = ((body or {}).get("metadata") or {}).get("resourceVersion")
        if rv is not None and rv != current["metadata"]["resourceVersion"]:
            return _status(409, "Conflict", f'Operation cannot be fulfilled on nodes "{name}": the object has been modified; '
                                            "please apply your changes to the latest version and try again")
        spec = (body or {}).get("spec") or {}
        if "taints" in spec:  # no patchMergeKey on taints: the list is replaced
            if spec["taints"] is None:
                current["spec"].pop("taints", None)
            else:
                current["spec"]["taints"] = spec["taints"]
        _bump(current)
        return 200, current

    def _concurrent_write(self, name: str, current: dict) -> None:
        self.conflicts[name] -= 1
        # Another writer got there first: its taint lands and the version moves on.
        if self.concurrent_taint is not None:
            current["spec"].setdefault("taints", []).append(self.concurrent_taint)
        _bump(current)

    @staticmethod
    def _patch_node_status(current: dict, body):
        conds = current["status"].setdefault("conditions", [])
        for c in ((body or {}).get("status") or {}).get("conditions") or []:  # patchMergeKey: type
            for i, existing in enumerate(conds):
                if existing["type"] == c["type"]:
                    conds[i] = {**existing, **c}
                    break
            else:
                conds.append(c)
        _bump(current)
        return 200, current


def _refused_patch_type(content_type):
    """The 415 answer to a patch in a media type this fake does not take; None for a strategic merge patch."""
    if content_type not in PATCH_TYPES:
        return _status(415, "UnsupportedMediaType",
                       f"the body of the request was in an unknown format - accepted media types include: {', '.join(PATCH_TYPES)}")
    if content_type != "application/strategic-merge-patch+json":
        return _status(415, "UnsupportedMediaType", "this fake takes strategic merge patches only")
    return None


def _bump(n: dict) -> None:
    n["metadata"]["resourceVersion"] = str(int(n["metadata"]["resourceVersion"]) + 1)


def _status(code: int, reason: str, message: str):
    return code, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code}
