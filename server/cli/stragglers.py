"""`laggard stragglers`: the active episodes of a running collector, as a table or JSON."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys

from server.collector_client import CollectorUnavailable, add_server_flags, call_collector

COLUMNS = ("ID", "CLUSTER", "NODE", "GPU", "CAUSE", "SEVERITY", "SINCE", "SUMMARY")


def add_parser(sub) -> None:
    p = sub.add_parser("stragglers", help="print the active stragglers of a running collector")
    add_server_flags(p)
    p.add_argument("-o", "--output", choices=["table", "json"], default="table")
    p.add_argument("--cluster")
    p.add_argument("--node")
    p.add_argument("--cause")
    p.add_argument("--severity", choices=["warning", "critical"])
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    params = {k: v for k in ("cluster", "node", "cause", "severity") if (v := getattr(args, k)) is not None}
    try:
        resp = call_collector("GET", args.server, "/api/v1/stragglers", token=args.token, expect=200, timeout=10, params=params)
    except CollectorUnavailable as exc:
        print(f"laggard: {exc}", file=sys.stderr)
        return 1
    stragglers = resp.json()["stragglers"]
    if args.output == "json":
        print(json.dumps(resp.json(), indent=2))
    else:
        print(render_table(stragglers))
    return 0


def render_table(stragglers: list[dict]) -> str:
    if not stragglers:
        return "no active stragglers"
    rows = [
        (
            str(s["id"]), s["cluster"], s["node"], "-" if s["gpu"] is None else str(s["gpu"]), s["cause"], s["severity"],
            dt.datetime.fromtimestamp(s["onset"], dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ"), s["summary"],
        )
        for s in stragglers
    ]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(COLUMNS)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)
