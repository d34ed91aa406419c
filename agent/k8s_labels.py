"""`python -m agent.k8s_labels`: copy some of this node's Kubernetes labels into a file the agent
reads as LAGGARD_LABELS (peer-group labels: `partition`, `rack`, …).

The downward API gives a pod its own labels, not its node's, so the agent DaemonSet runs this in
an initContainer (same image, in-cluster service account allowed to `get` nodes) and its main
container exports the file's line as LAGGARD_LABELS (deploy/kubernetes/agent.yaml). Node labels
rarely change; a changed one is picked up when the pod restarts.

    --map partition=cloud.google.com/gke-nodepool,rack=example.com/rack
      agent label `partition` ← node label `cloud.google.com/gke-nodepool`; a bare KEY keeps
      the node label's name. Labels the node lacks are left out (logged).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import httpx

log = logging.getLogger("agent.k8s_labels")

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def parse_map(spec: str) -> dict[str, str]:
    """"partition=cloud.google.com/gke-nodepool,zone" → {agent label: node label}."""
    mapping: dict[str, str] = {}
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        ours, sep, theirs = item.partition("=")
        ours, theirs = ours.strip(), theirs.strip()
        if sep and not (ours and theirs):
            raise ValueError(f"--map item {item!r}: expected LABEL=NODE_LABEL or NODE_LABEL")
        mapping[ours] = theirs if sep else ours
    return mapping


def pick_labels(node_labels: dict[str, str], mapping: dict[str, str]) -> dict[str, str]:
    picked = {}
    for ours, theirs in mapping.items():
        if theirs in node_labels:
            picked[ours] = node_labels[theirs]
        else:
            log.warning("node has no label %s: agent label %s left out", theirs, ours)
    return picked


def in_cluster_api() -> str:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise ValueError("KUBERNETES_SERVICE_HOST is not set: not in a pod? Pass --api-server")
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def fetch_node_labels(api: str, node: str, *, token: str | None, ca_file: str | None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    verify = ca_file if ca_file and api.startswith("https://") else True
    reply = httpx.get(f"{api.rstrip('/')}/api/v1/nodes/{node}", headers=headers, verify=verify, timeout=10)
    if reply.status_code != 200:
        raise RuntimeError(f"GET node {node}: HTTP {reply.status_code}: {reply.text[:300]}")
    return reply.json().get("metadata", {}).get("labels") or {}


def build_parser(env: dict[str, str]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m agent.k8s_labels",
                                description="Write some of this node's Kubernetes labels as a LAGGARD_LABELS line.")
    p.add_argument("--node", default=env.get("NODE_NAME"), help="node name (env NODE_NAME)")
    p.add_argument("--map", default=env.get("LAGGARD_NODE_LABELS", ""),
                   help="LABEL=NODE_LABEL or NODE_LABEL, comma-separated (env LAGGARD_NODE_LABELS)")
    p.add_argument("--output", required=True, help="file to write the k=v,k2=v2 line to")
    p.add_argument("--api-server", default=None, help="API server URL (default: the in-cluster one)")
    p.add_argument("--token-file", default=str(SERVICE_ACCOUNT / "token"))
    p.add_argument("--ca-file", default=str(SERVICE_ACCOUNT / "ca.crt"))
    return p


def main(argv: list[str] | None = None, env: dict[str, str] | None = None) -> int:
    env = dict(os.environ if env is None else env)
    args = build_parser(env).parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    try:
        mapping = parse_map(args.map)
        if mapping and not args.node:
            raise ValueError("no node name: set NODE_NAME (downward API spec.nodeName) or --node")
        labels: dict[str, str] = {}
        if mapping:  # nothing asked for: write an empty line, ask the API nothing
            token_file = Path(args.token_file)
            token = token_file.read_text().strip() if token_file.exists() else None
            api = args.api_server or in_cluster_api()
            labels = pick_labels(fetch_node_labels(api, args.node, token=token, ca_file=args.ca_file), mapping)
        Path(args.output).write_text(",".join(f"{k}={v}" for k, v in labels.items()) + "\n")
    except (ValueError, RuntimeError, OSError, httpx.HTTPError) as exc:
        print(f"agent.k8s_labels: error: {exc}", file=sys.stderr)
        return 1
    log.info("labels from node %s: %s", args.node, labels or "none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
