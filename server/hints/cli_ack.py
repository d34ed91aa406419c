"""`laggard ack NODE`: tell a running collector that the remedy of a node's hardware fault happened
(the GPU was reset, the node rebooted, the field check done), so the hint that held it drained
may clear; the collector records the token's name and the time (POST /api/v1/acks, admin scope)."""

from __future__ import annotations

import argparse
import sys

from server.collector_client import CollectorUnavailable, add_server_flags, call_collector
from server.protocol import DEFAULT_CLUSTER


def add_parser(sub) -> None:
    p = sub.add_parser("ack", help="acknowledge that a node's (or GPU's) hardware fault was remedied, so its hint may clear")
    add_server_flags(p)
    p.add_argument("node", help="the node, as the agents name it")
    p.add_argument("--cluster", default=DEFAULT_CLUSTER, help=f"its cluster (default {DEFAULT_CLUSTER})")
    p.add_argument("--gpu", type=int, help="only this GPU index (default: every fault of the node)")
    p.add_argument("--note", default="", help="what was done, kept with the acknowledgement (e.g. 'GPU 6 reseated, ticket 4711')")
    p.set_defaults(run=run_ack)


def run_ack(args: argparse.Namespace) -> int:
    body = {"node": args.node, "cluster": args.cluster, "gpu": args.gpu, "note": args.note}
    try:
        resp = call_collector("POST", args.server, "/api/v1/acks", token=args.token, expect=201, timeout=30, json=body)
    except CollectorUnavailable as exc:
        print(f"laggard ack: {exc}", file=sys.stderr)
        return 1
    ack = resp.json()
    what = f"GPU {ack['gpu']} of {ack['node']}" if ack["gpu"] is not None else ack["node"]
    print(f"acknowledged {what} ({ack['cluster']}) as {ack['acked_by']}: its faults up to sample time "
          f"{ack['sample_time']:.0f} no longer hold its hint")
    return 0
