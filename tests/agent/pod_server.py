"""A small real HTTP server answering GET /api/v1/pods with a PodList, as the API server does for
`fieldSelector=spec.nodeName=<node>`; it records requests and can be told to fail."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse


def pod(name: str, uid: str, *, namespace: str = "default", node: str = "gpu-1", labels: dict | None = None,
        annotations: dict | None = None, owners: list[dict] | None = None, containers: dict[str, str] | None = None,
        scheme: str = "containerd") -> dict[str, Any]:
    """A Pod as the API server returns it (the fields attribution reads, and some it does not)."""
    statuses = [{"name": c, "containerID": f"{scheme}://{cid}", "ready": True, "restartCount": 0,
                 "image": "nvcr.io/nvidia/pytorch:24.05-py3", "state": {"running": {"startedAt": "2025-01-01T00:00:00Z"}}}
                for c, cid in (containers or {}).items()]
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": "1234",
                     "labels": labels or {}, "annotations": annotations or {}, "ownerReferences": owners or []},
        "spec": {"nodeName": node, "containers": [{"name": c, "image": "nvcr.io/nvidia/pytorch:24.05-py3"} for c in (containers or {})]},
        "status": {"phase": "Running", "podIP": "10.0.3.17", "containerStatuses": statuses},
    }


class PodServer:
    def __init__(self, pods: list[dict[str, Any]], *, token: str | None = "t0k3n") -> None:
        self.pods = pods
        self.token = token
        self.status = 200  # set to e.g. 500 or 403 to make lists fail
        self.requests: list[dict[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                server._get(self)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def pods_url(self, node: str = "gpu-1") -> str:
        return f"{self.url}/api/v1/pods?fieldSelector=spec.nodeName%3D{node}&resourceVersion=0"

    def _get(self, h: BaseHTTPRequestHandler) -> None:
        url = urlparse(h.path)
        query = parse_qs(url.query)
        self.requests.append({"path": url.path, "query": query, "authorization": h.headers.get("Authorization")})
        if self.token is not None and h.headers.get("Authorization") != f"Bearer {self.token}":
            code, body = 401, {"kind": "Status", "status": "Failure", "reason": "Unauthorized", "code": 401}
        elif self.status != 200:
            code, body = self.status, {"kind": "Status", "status": "Failure", "message": "boom", "code": self.status}
        elif url.path != "/api/v1/pods":
            code, body = 404, {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404}
        else:
            selector = (query.get("fieldSelector") or [""])[0]
            node = selector.partition("spec.nodeName=")[2]
            items = [p for p in self.pods if not node or p["spec"]["nodeName"] == node]
            code, body = 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "99"}, "items": items}
        data = json.dumps(body).encode()
        h.send_response(code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def __enter__(self) -> PodServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
