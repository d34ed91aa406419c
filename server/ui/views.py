"""View models of the status page, pure: what the fleet grid, an episode and a node show, built
from plain dicts (inventory rows, episodes as the API serves them, the hints document) so that
they are tested without a database or a browser."""

from __future__ import annotations

import datetime as dt
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from server.hints.k8s_sync import plan_node
from server.hints.render import reason_text
from server.hints.settings import HintSettings
from server.hints.slurm_sync import drain_reason
from server.peer_groups import is_busy, peer_group
from server.ui.series import reason_names

SEVERITY_RANK = {"warning": 1, "critical": 2}
ACTIONS = ("ok", "rebalance", "avoid", "drain")
CAUSE_ABBREV = {"thermal": "T", "power": "P", "hw_slowdown": "S", "clock": "C", "nvlink": "N", "pcie": "E", "network": "I",
                "xid": "X", "ecc": "M", "lost": "L"}
STALE_AFTER_S = 60.0  # a node this far (sample time) behind its cluster's newest sample shows as stale


@dataclass
class Cell:
    """One GPU in the grid."""

    cluster: str
    node: str
    index: int
    uuid: str | None
    state: str  # flagged, lost, stale, nodata, idle, ok
    css: str  # the colour class
    label: str
    title: str
    deviation: float | None = None
    episode: dict[str, Any] | None = None
    action: str = "ok"
    capacity: float = 1.0


@dataclass
class NodeRow:
    cluster: str
    node: str
    labels: dict[str, Any]
    stale: bool
    cells: list[Cell]
    node_episodes: list[dict[str, Any]] = field(default_factory=list)
    action: str = "ok"
    capacity: float = 1.0


def worst_episode(eps: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The gravest: critical before warning, then the earliest detected."""
    return min(eps, key=lambda e: (-SEVERITY_RANK.get(e["severity"], 0), e["detected_at"], e["id"]), default=None)


def clock_ratio(sample: Mapping[str, Any] | None) -> float | None:
    if not sample or sample.get("lost") or not sample.get("sm_clock_mhz") or not sample.get("sm_clock_max_mhz"):
        return None
    return sample["sm_clock_mhz"] / sample["sm_clock_max_mhz"]


def busy(sample: Mapping[str, Any] | None) -> bool:
    return bool(sample) and not sample.get("lost") and is_busy(sample.get("util_gpu_pct"), sample.get("clocks_event_reasons"))


def peer_medians(gpus: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Per peer group, the median SM clock ratio (clock / max) of its busy GPUs (two at least)."""
    ratios: dict[str, list[float]] = defaultdict(list)
    for g in gpus:
        ratio = clock_ratio(g.get("sample"))
        if ratio is not None and busy(g.get("sample")):
            ratios[group_of(g)].append(ratio)
    return {k: statistics.median(v) for k, v in ratios.items() if len(v) >= 2}


def group_of(gpu: Mapping[str, Any]) -> str:
    return peer_group(cluster=gpu["cluster"], model=gpu.get("model"), labels=gpu.get("labels") or {})


def deviation_class(deviation: float | None, drop: float) -> str:
    """Shades of how far below its peers' median clock a busy, unflagged GPU runs; `drop` is
    the detector's clock_drop (a deviation that far is what it would judge)."""
    if deviation is None or deviation > -drop / 4:
        return "c-ok"
    if deviation > -drop / 2:
        return "c-dev1"
    return "c-dev2" if deviation > -drop else "c-dev3"


def cell_for(gpu: Mapping[str, Any], *, episode: Mapping[str, Any] | None, median: float | None, stale: bool, drop: float) -> Cell:
    sample = gpu.get("sample")
    ratio = clock_ratio(sample)
    deviation = ratio / median - 1 if ratio is not None and median and busy(sample) else None
    facts = _facts(sample, deviation)
    where = f"{gpu['node']} GPU {gpu['index']}"
    if episode is not None:
        state, css, label = "flagged", f"c-{episode['severity']}", CAUSE_ABBREV.get(episode["cause"], "?")
        facts = [f"{episode['cause']} {episode['severity']}: {episode.get('summary', '')}"] + facts
    elif sample is None:
        state, css, label = ("stale" if stale else "nodata"), "c-nodata", ""
        facts = ["no recent sample"]
    elif sample.get("lost"):
        state, css, label = "lost", "c-lost", "L"
    elif stale:
        state, css, label = "stale", "c-nodata", ""
    elif not busy(sample):
        state, css, label = "idle", "c-idle", ""
    else:
        state, css, label = "ok", deviation_class(deviation, drop), ""
    return Cell(cluster=gpu["cluster"], node=gpu["node"], index=gpu["index"], uuid=gpu.get("uuid"), state=state, css=css, label=label,
                title=" · ".join([where, state, *facts]), deviation=deviation, episode=dict(episode) if episode else None)


def _facts(sample: Mapping[str, Any] | None, deviation: float | None) -> list[str]:
    if not sample:
        return []
    out = []
    if sample.get("sm_clock_mhz") is not None:
        dev = f" ({deviation:+.1%} vs peers)" if deviation is not None else ""
        out.append(f"SM {sample['sm_clock_mhz']} MHz{dev}")
    if sample.get("util_gpu_pct") is not None:
        out.append(f"util {sample['util_gpu_pct']:.0f}%")
    if sample.get("temp_c") is not None:
        out.append(f"{sample['temp_c']:.0f} °C")
    names = [n for n in reason_names(sample.get("clocks_event_reasons")) if n != "GPU idle"]
    if names:
        out.append(" + ".join(names))
    return out


def hint_index(doc: Mapping[str, Any] | None) -> tuple[dict[tuple[str, str], Mapping[str, Any]], dict[tuple[str, str, int], Mapping[str, Any]]]:
    nodes, gpus = {}, {}
    for n in (doc or {}).get("nodes", []):
        nodes[(n["cluster"], n["node"])] = n
        for g in n.get("gpus", []):
            gpus[(n["cluster"], n["node"], g["index"])] = g
    return nodes, gpus


def fleet_view(nodes: Sequence[Mapping[str, Any]], gpus: Sequence[Mapping[str, Any]], episodes: Sequence[Mapping[str, Any]],
               hints: Mapping[str, Any] | None, *, clock_drop: float = 0.08) -> dict[str, Any]:
    """The fleet at a glance: per cluster its nodes, each node's GPUs as grid cells; the active
    episodes counted by cause and severity; the capacity lost (from the hints)."""
    medians = peer_medians(gpus)
    node_hints, gpu_hints = hint_index(hints)
    by_gpu, by_node = split_episodes(episodes)
    now = cluster_clocks(nodes)
    gpus_of: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for g in gpus:
        gpus_of[(g["cluster"], g["node"])].append(g)
    rows = []
    for n in sorted(nodes, key=lambda n: (n["cluster"], n["node"])):
        key = (n["cluster"], n["node"])
        stale = now[n["cluster"]] - n["last_seen"] > STALE_AFTER_S
        cells = []
        for g in sorted(gpus_of[key], key=lambda g: g["index"]):
            cell = cell_for(g, episode=worst_episode(by_gpu[(*key, g["index"])]), median=medians.get(group_of(g)), stale=stale, drop=clock_drop)
            hint = gpu_hints.get((*key, g["index"]))
            if hint is not None:
                cell.action, cell.capacity = hint["action"], hint["capacity"]
            cells.append(cell)
        hint = node_hints.get(key)
        rows.append(NodeRow(cluster=n["cluster"], node=n["node"], labels=dict(n.get("labels") or {}), stale=stale, cells=cells,
                            node_episodes=sorted(by_node[key], key=lambda e: -SEVERITY_RANK.get(e["severity"], 0)),
                            action=hint["action"] if hint else "ok", capacity=hint["capacity"] if hint else 1.0))
    clusters: dict[str, list[NodeRow]] = defaultdict(list)
    for r in rows:
        clusters[r.cluster].append(r)
    return {"clusters": [{"name": c, "nodes": rs, "now": now[c], **_totals(rs)} for c, rs in sorted(clusters.items())],
            "counts": episode_counts(episodes), "capacity": capacity_lost(hints), "episodes": sorted_episodes(episodes)}


def split_episodes(episodes: Iterable[Mapping[str, Any]]) -> tuple[dict, dict]:
    """Episodes by GPU (cluster, node, index) and node-level ones (a port) by (cluster, node)."""
    by_gpu: dict[tuple[str, str, int], list[Mapping[str, Any]]] = defaultdict(list)
    by_node: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for ep in episodes:
        if ep.get("gpu") is None:
            by_node[(ep["cluster"], ep["node"])].append(ep)
        else:
            by_gpu[(ep["cluster"], ep["node"], ep["gpu"])].append(ep)
    return by_gpu, by_node


def cluster_clocks(nodes: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Each cluster's "now": its newest sample time (as the hints take it)."""
    now: dict[str, float] = {}
    for n in nodes:
        now[n["cluster"]] = max(now.get(n["cluster"], n["last_seen"]), n["last_seen"])
    return now


def _totals(rows: Sequence[NodeRow]) -> dict[str, int]:
    states = Counter(c.state for r in rows for c in r.cells)
    return {"gpus": sum(states.values()), "flagged": states["flagged"], "idle": states["idle"],
            "unseen": states["lost"] + states["stale"] + states["nodata"]}


def episode_counts(episodes: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Active episodes per cause: [{cause, warning, critical, total}], the most first."""
    counts: dict[str, Counter] = defaultdict(Counter)
    for ep in episodes:
        counts[ep["cause"]][ep["severity"]] += 1
    rows = [{"cause": c, "warning": n["warning"], "critical": n["critical"], "total": n["warning"] + n["critical"]} for c, n in counts.items()]
    return sorted(rows, key=lambda r: (-r["total"], -r["critical"], r["cause"]))


def sorted_episodes(episodes: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return sorted(episodes, key=lambda e: (-SEVERITY_RANK.get(e["severity"], 0), -e["detected_at"], e["id"]))


def capacity_lost(hints: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """From the hints document: GPUs known, the capacity lost in GPU-equivalents (sum of 1 -
    capacity over GPUs) and as a fraction, and how many nodes have each action."""
    if hints is None:
        return None
    caps = [g["capacity"] for n in hints.get("nodes", []) for g in n.get("gpus", [])]
    lost = sum(1.0 - c for c in caps)
    actions = Counter(n["action"] for n in hints.get("nodes", []))
    return {"gpus": len(caps), "lost": lost, "fraction": lost / len(caps) if caps else 0.0,
            "actions": {a: actions.get(a, 0) for a in ACTIONS}, "generated_at": hints.get("generated_at")}


# --- one node -------------------------------------------------------------------------------


def scheduler_entry(hint: Mapping[str, Any]) -> dict[str, Any]:
    """A node of the hints document as the syncs see it (render.by_node_name's entry)."""
    reasons = hint.get("reasons") or []
    return {"action": hint["action"], "capacity": hint["capacity"], "cause": reasons[0]["cause"] if reasons else None,
            "text": reason_text(hint) if reasons else ""}


def slurm_says(node: str, hint: Mapping[str, Any] | None, cfg: HintSettings) -> str:
    """What `laggard slurm-sync` would do to the node (server/hints/slurm_sync.py)."""
    if hint is None:
        return "nothing: no hint for this node"
    entry = scheduler_entry(hint)
    if entry["action"] in cfg.slurm_drain_actions:
        return f'scontrol update NodeName={node} State=DRAIN Reason="{drain_reason(entry, cfg)}"'
    if entry["action"] in cfg.slurm_avoid_actions:
        return f"Weight raised by {cfg.slurm_avoid_weight} (allocated last, still schedulable)"
    if entry["action"] in cfg.slurm_resume_actions:
        return f"nothing (resumed if slurm-sync drained it: Reason starting {cfg.slurm_reason_prefix!r})"
    return f"nothing for action {entry['action']}"


def kubernetes_says(node: str, hint: Mapping[str, Any] | None, cfg: HintSettings, *, now: str = "now") -> dict[str, Any]:
    """The taint and condition `laggard k8s-sync` would set (server/hints/k8s_sync.py)."""
    plan = plan_node({"metadata": {"name": node}}, scheduler_entry(hint) if hint else None, cfg, now=now)
    taints = [t for t in (plan.taints_after or []) if t.get("key") == cfg.taint_key]
    taint = None
    if taints:
        t = taints[0]
        taint = f"{t['key']}={t['value']}:{t['effect']}" if t.get("value") else f"{t['key']}:{t['effect']}"
    c = plan.condition
    condition = f"{c['type']}={c['status']} ({c['reason']}): {c['message']}" if c else None
    return {"taint": taint, "condition": condition}


def gpu_rows(gpus: Sequence[Mapping[str, Any]], hint: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The node's GPUs with their latest sample (queries.node_gpus_latest) and their hint."""
    hints = {g["index"]: g for g in (hint or {}).get("gpus", [])}
    out = []
    for g in gpus:
        s = g.get("latest") or {}
        h = hints.get(g["index"], {})
        out.append({"index": g["index"], "uuid": g.get("uuid"), "model": g.get("model"), "action": h.get("action", "ok"),
                    "capacity": h.get("capacity", 1.0), "sample": s, "reasons": reason_names(s.get("clocks_event_reasons")),
                    "busy": busy(s) if s else False})
    return out


# --- one episode ----------------------------------------------------------------------------


def flatten(evidence: Mapping[str, Any] | None, prefix: str = "") -> list[tuple[str, str]]:
    """Evidence as (key, text) rows, nested objects as dotted keys."""
    rows: list[tuple[str, str]] = []
    for key, value in (evidence or {}).items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            rows += flatten(value, name + ".")
        elif _is_instant(key, value):
            rows.append((name, when(value)))
        else:
            rows.append((name, show(value)))
    return rows


def _is_instant(key: str, value: Any) -> bool:
    """An epoch time by its name (window from/to, *_at, onset, since, until) and size."""
    named = key in ("from", "to", "onset", "since", "until", "ts") or key.endswith("_at")
    return named and isinstance(value, (int, float)) and not isinstance(value, bool) and value > 1e8


def show(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e6 else f"{value:.4e}"
    if isinstance(value, (list, tuple)):
        return ", ".join(show(v) for v in value) or "—"
    return str(value)


def timeline(ep: Mapping[str, Any], events: Sequence[Mapping[str, Any]] = ()) -> list[tuple[str, float | None, str]]:
    """(what, when, clock) of the episode: onset, detection, escalations, resolution."""
    out: list[tuple[str, float | None, str]] = [("onset", ep["onset"], "sample time"), ("detected", ep["detected_at"], "sample time")]
    for e in events:
        if e.get("change") == "escalated":
            out.append((f"escalated to {(e.get('episode') or {}).get('severity', '?')}", e.get("at"), "collector clock"))
    out.append(("resolved", ep.get("resolved_at"), "sample time"))
    return out


def when(ts: float | None) -> str:
    if ts is None:
        return "—"
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def ago(ts: float | None, now: float | None) -> str:
    if ts is None or now is None:
        return ""
    s = max(now - ts, 0.0)
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h" if s < 172800 else f"{s / 86400:.1f} d"
