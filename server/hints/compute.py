"""The hints: every known node and GPU with an action and a capacity, computed from episodes
alone (node-problem-detector style: hints never look at samples or at the detector's state).

Per entity (a GPU, or the node itself for node-level episodes such as an IB port):
  action   = the worst action of its live episodes (mapping.action_for), escalated from
             rebalance to avoid once the hint has lasted avoid_after_s;
  capacity = the lowest capacity of its live episodes (mapping.capacity_for).
Per GPU, as served: its own hint combined with its node's node-level hint (worst action,
lowest capacity) — a GPU behind a degraded NIC is as slow as the NIC lets it be — so a job can
size each rank's share from gpus[].capacity alone.
Per node: the worst action and lowest capacity over its GPUs and its node-level hint (a
synchronous job using the whole node runs at its slowest GPU); `since` is the earliest start
among the hints live now.
A resolved hardware fault whose remedy has not been seen nor acknowledged stays live past its
cool-down (remedy.py); its reason carries `held` ({remedy, until}) and no `clears_at`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from server.hints.cooldown import current_chain
from server.hints.mapping import action_for, capacity_for, worst
from server.hints.remedy import Ack, GpuFacts, hold
from server.hints.settings import RANK, Action, HintSettings


@dataclass(frozen=True)
class KnownNode:
    cluster: str
    name: str
    gpus: tuple[tuple[int, str | None], ...] = ()  # (index, uuid)


@dataclass
class EntityHint:
    action: Action = "ok"
    capacity: float = 1.0
    since: float | None = None
    reasons: list[dict[str, Any]] = field(default_factory=list)


def entity_hint(episodes: Iterable[Mapping[str, Any]], *, now: float, cfg: HintSettings,
                table: Mapping[str, Action] | None = None, facts: GpuFacts | None = None,
                acks: Iterable[Ack] = ()) -> EntityHint:
    """The hint of one GPU (or one node's node-level entity) from its episodes, the facts of the
    GPU (remedy evidence) and the operators' acks for its node."""
    if not episodes:  # most GPUs of a node with an episode elsewhere
        return EntityHint()
    table = cfg.action_table() if table is None else table
    chain = current_chain(mark_held(episodes, facts, acks, cfg), now, cfg.cooldown_s)
    if chain is None:
        return EntityHint()
    reasons = []
    for ep in chain.live:
        action = action_for(ep["cause"], ep["severity"], cfg, table)
        capacity = capacity_for(ep["cause"], ep["severity"], ep.get("evidence"), action, cfg)
        resolved = ep.get("resolved_at")
        reason = {
            "episode": ep.get("id"), "gpu": ep.get("gpu"), "cause": ep["cause"], "severity": ep["severity"],
            "action": action, "capacity": capacity, "summary": ep.get("summary", ""), "job": _job_of(ep), "onset": ep["onset"],
            "resolved_at": resolved, "clears_at": None if resolved is None or ep.get("held") else float(resolved) + cfg.cooldown_s,
        }
        if ep.get("held"):
            reason["held"] = ep["held"]
        reasons.append(reason)
    action = worst(r["action"] for r in reasons)
    if action == "ok":  # every live episode is mapped to ok: nothing to hint
        return EntityHint()
    escalated = action == "rebalance" and cfg.avoid_after_s is not None and now - chain.since >= cfg.avoid_after_s
    if escalated:
        action = "avoid"
    reasons.sort(key=lambda r: (-RANK[r["action"]], r["onset"], r["episode"] or 0))
    if escalated:
        for r in reasons:
            if r["action"] == "rebalance":
                r["action"] = "avoid"
                r["escalated"] = f"rebalance for {now - chain.since:.0f} s (avoid_after_s {cfg.avoid_after_s:.0f})"
    return EntityHint(action=action, capacity=min(r["capacity"] for r in reasons), since=chain.since, reasons=reasons)


def mark_held(episodes: Iterable[Mapping[str, Any]], facts: GpuFacts | None, acks: Iterable[Ack],
              cfg: HintSettings) -> list[Mapping[str, Any]]:
    """The episodes, those held until a remedy (remedy.hold) copied with `held` set."""
    episodes = list(episodes)
    if not episodes or not cfg.hold_until_remedy:
        return episodes
    remedies, acks = cfg.remedy_table(), list(acks)
    out: list[Mapping[str, Any]] = []
    for ep in episodes:
        held = hold(ep, facts, acks, remedies)
        out.append({**ep, "held": held} if held else ep)
    return out


def compute_hints(episodes: Iterable[Mapping[str, Any]], nodes: Iterable[KnownNode], clocks: Mapping[str, float],
                  cfg: HintSettings, *, generated_at: float, facts: Mapping[tuple[str, str, int], GpuFacts] | None = None,
                  acks: Iterable[Ack] = (), ok_entries: dict[tuple[str, str], dict[str, Any]] | None = None) -> dict[str, Any]:
    """The hints document served by GET /api/v1/hints.

    episodes: episode dicts (store/episodes.py PUBLIC_FIELDS), open or recently resolved;
    nodes: every node known to the collector, with its GPUs;
    clocks: cluster → newest sample time seen (the "now" of cool-downs);
    facts: (cluster, node, GPU index) → what shows a remedy happened (remedy.GpuFacts);
    acks: the operators' acknowledgements (remedy.Ack);
    ok_entries: (cluster, node) → the entry of that node without episodes, kept by the caller
    for as long as `nodes` stays the same (inventory.py), filled here; entries are shared by
    the documents made with it, so no reader may modify them.
    """
    table = cfg.action_table()
    facts = facts or {}
    acks_by_node: dict[tuple[str, str], list[Ack]] = defaultdict(list)
    for ack in acks:
        acks_by_node[(ack.cluster, ack.node)].append(ack)
    by_entity: dict[tuple[str, str, int | None], list[Mapping[str, Any]]] = defaultdict(list)
    for ep in episodes:
        by_entity[(ep["cluster"], ep["node"], ep.get("gpu"))].append(ep)

    known: dict[tuple[str, str], dict[int, str | None]] = {}
    for n in nodes:
        known[(n.cluster, n.name)] = dict(n.gpus)
    for cluster, node, gpu in by_entity:  # episodes of a node or GPU not (yet) in the inventory
        gpus = known.setdefault((cluster, node), {})
        if gpu is not None and gpu not in gpus:
            gpus[gpu] = next((e.get("uuid") for e in by_entity[(cluster, node, gpu)] if e.get("uuid")), None)

    # A cluster without a known sample time falls back to the newest episode time seen.
    fallback: dict[str, float] = {}
    for (cluster, _, _), eps in by_entity.items():
        fallback[cluster] = max(fallback.get(cluster, 0.0), *(_latest_time(e) for e in eps))
    clocks = {**fallback, **clocks}

    out_nodes = []
    with_episodes = {(cluster, node) for cluster, node, _ in by_entity}
    for (cluster, node), gpus in sorted(known.items()):
        if (cluster, node) not in with_episodes:
            # No episode, so no hint whatever the clock or the acks: most of a large fleet.
            if ok_entries is None:
                out_nodes.append(_ok_node(cluster, node, gpus))
            else:
                entry = ok_entries.get((cluster, node))
                if entry is None:
                    entry = ok_entries[(cluster, node)] = _ok_node(cluster, node, gpus)
                out_nodes.append(entry)
            continue
        out_nodes.append(_node_entry(cluster, node, gpus, by_entity, now=clocks.get(cluster, 0.0), cfg=cfg, table=table,
                                     facts=facts, acks=acks_by_node.get((cluster, node), ())))
    return {"generated_at": generated_at, "sample_time": dict(sorted(clocks.items())), "nodes": out_nodes}


def _node_entry(cluster: str, node: str, gpus: Mapping[int, str | None],
                by_entity: Mapping[tuple[str, str, int | None], list[Mapping[str, Any]]], *, now: float, cfg: HintSettings,
                table: Mapping[str, Action], facts: Mapping[tuple[str, str, int], GpuFacts], acks: Iterable[Ack]) -> dict[str, Any]:
    """A node's entry: the worst of its node-level entity and its GPUs."""
    node_level = entity_hint(by_entity.get((cluster, node, None), ()), now=now, cfg=cfg, table=table, acks=acks)
    gpu_out = []
    hints = [node_level]
    for index in sorted(gpus):
        own = entity_hint(by_entity.get((cluster, node, index), ()), now=now, cfg=cfg, table=table,
                          facts=facts.get((cluster, node, index)), acks=acks)
        hints.append(own)
        gpu_out.append({
            "index": index, "uuid": gpus[index],
            "action": worst((own.action, node_level.action)),
            "capacity": min(own.capacity, node_level.capacity),
        })
    live = [h for h in hints if h.action != "ok"]
    reasons = sorted((r for h in live for r in h.reasons), key=lambda r: (-RANK[r["action"]], r["onset"], r["episode"] or 0))
    return {
        "node": node, "cluster": cluster,
        "action": worst(h.action for h in hints),
        "capacity": min(h.capacity for h in hints),
        "since": min((h.since for h in live), default=None),
        "reasons": reasons,
        "gpus": gpu_out,
    }


def _ok_node(cluster: str, node: str, gpus: Mapping[int, str | None]) -> dict[str, Any]:
    """The entry of a node none of whose entities has an episode: what entity_hint() of no
    episodes (EntityHint()) makes of it, without the calls."""
    return {
        "node": node, "cluster": cluster, "action": "ok", "capacity": 1.0, "since": None, "reasons": [],
        "gpus": [{"index": index, "uuid": gpus[index], "action": "ok", "capacity": 1.0} for index in sorted(gpus)],
    }


def _job_of(ep: Mapping[str, Any]) -> str | None:
    """The job the episode's GPU ran when it opened (evidence.job, issue #15), None where none was
    attributed: the reason texts name every job a node's hint slows (render.reason_text)."""
    job = (ep.get("evidence") or {}).get("job")
    return job if isinstance(job, str) and job else None


def _latest_time(ep: Mapping[str, Any]) -> float:
    times = [ep.get("detected_at"), ep.get("resolved_at"), ep.get("onset")]
    return max((float(t) for t in times if t is not None), default=-math.inf)
