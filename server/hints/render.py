"""Hints as text: Slurm/NHC lines and the `laggard hints` table."""

from __future__ import annotations

import datetime as dt
from typing import Any

from server.hints.settings import RANK

COLUMNS = ("CLUSTER", "NODE", "ACTION", "CAPACITY", "SINCE", "GPUS", "REASON")


def reason_text(node: dict[str, Any]) -> str:
    """The gravest reason of a node on one line: 'cause: summary' (+N more, also slowing job B).
    The one text of a node's hint: Slurm drain reasons, the Kubernetes condition's message, the
    `laggard hints` table."""
    reasons = node.get("reasons") or []
    if not reasons:
        return "-"
    first = reasons[0]
    text = f"{first['cause']}: {first['summary']}"
    if len(reasons) > 1:
        text += f" (+{len(reasons) - 1} more{_other_jobs(reasons)})"
    return " ".join(text.split())  # one line whatever the summary holds


def _other_jobs(reasons: list[dict[str, Any]]) -> str:
    """', also slowing job B' for the jobs the further reasons slow besides the gravest one's (its
    summary names that one): on a node two jobs share, a drain or taint stops both, and the
    owners of each need to find their job in it."""
    named = reasons[0].get("job")
    others = list(dict.fromkeys(r["job"] for r in reasons[1:] if r.get("job") and r["job"] != named))
    if not others:
        return ""
    return f", also slowing job{'s' if len(others) > 1 else ''} {', '.join(others)}"


def by_node_name(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Node name → {action, capacity, cause, text} (cause and text of the gravest reason), for
    schedulers that name nodes without a cluster; a name in several clusters takes the worst."""
    out: dict[str, dict[str, Any]] = {}
    for n in doc["nodes"]:
        reasons = n.get("reasons") or []
        entry = {"action": n["action"], "capacity": n["capacity"], "cause": reasons[0]["cause"] if reasons else None,
                 "text": reason_text(n) if reasons else ""}
        prev = out.get(n["node"])
        if prev is None or RANK[entry["action"]] > RANK[prev["action"]]:
            out[n["node"]] = entry
        elif entry["action"] == prev["action"]:
            prev["capacity"] = min(prev["capacity"], entry["capacity"])
    return out


def slurm_lines(doc: dict[str, Any]) -> list[str]:
    """`node action reason`, one per node that is not ok (for NHC-style health scripts)."""
    return [f"{n['node']} {n['action']} {reason_text(n)}" for n in doc["nodes"] if n["action"] != "ok"]


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def render_table(doc: dict[str, Any], *, all_nodes: bool = False) -> str:
    nodes = [n for n in doc["nodes"] if all_nodes or n["action"] != "ok"]
    if not nodes:
        ok = len(doc["nodes"])
        return f"all {ok} node{'s' if ok != 1 else ''} ok" if ok else "no nodes known"
    rows = []
    for n in nodes:
        gpus = ",".join(f"{g['index']}:{g['action']}@{g['capacity']:.2f}" for g in n["gpus"] if g["action"] != "ok") or "-"
        rows.append((n["cluster"], n["node"], n["action"], f"{n['capacity']:.2f}", _when(n["since"]), gpus, reason_text(n)))
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(COLUMNS)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    ok = len(doc["nodes"]) - len(nodes)
    if ok and not all_nodes:
        lines.append(f"({ok} more node{'s' if ok != 1 else ''} ok)")
    return "\n".join(lines)
