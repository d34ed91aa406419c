"""The detector: windows per GPU and port, peer statistics per node instant, nodes against nodes
over aligned windows, rules, persistence.

Peers are compared where their samples are simultaneous by construction: the GPUs (and ports)
of one node that belong to the same peer group, read by one agent at one instant. Their
counter rates cover the very same interval and their gauges the same moment of the job's
step, so neither a node's sampling phase, nor sub-second timing, nor the order in which nodes'
pushes arrive can make a healthy GPU look slow next to peers sampled at another moment (a
compute phase against a communication phase, a pause starting between two samples).

Each node is judged on its own, instant by instant in its own sample-time order, as its
samples arrive: nothing waits for other nodes, and a node that replays its spool after an
outage is judged exactly as it would have been live, up to `lateness_s` behind its cluster's
newest sample. A sample at or before its node's last judged instant (already judged, or out of
its node's order) and one beyond the lateness allowance are stored but not judged, and counted.

What a comparison inside one node cannot see (a whole node slower than the other nodes of its
job, a node with too few GPUs of a group for peers of its own) is judged a second way: nodes
against nodes, over windows aligned across them (server/detect/across.py), once every node
still reporting has been judged past a window's end.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import msgspec

from server.detect import rules
from server.detect.across_window import KINDS, Kind, NodeMembers
from server.detect.aligned import AlignedWindows
from server.detect.explain import explain
from server.detect.model import Finding, GpuObs, NicObs, Window, gpu_past, nic_past
from server.detect.namesakes import NamesakeRates
from server.detect.observe import GpuPrev, NicPrev, canonical, gpu_obs, nic_obs
from server.detect.peers import gpu_peer_stats, nic_peer_stats
from server.detect.persistence import Change, Condition, Resolved
from server.detect.screen import Recent, gpu_bounds, gpu_may_find, nic_bounds, nic_may_find
from server.detect.settings import DetectionSettings
from server.peer_groups import nic_group, peer_group

# Performance causes are about a busy GPU running slow: an idle instant with nothing found
# neither confirms nor clears them, so a checkpoint pause does not split one fault into two
# episodes. (What a rule does find on an idle GPU, e.g. a node-wide HW power brake that
# stalled it, still counts.)
JUDGED_ONLY_WHEN_BUSY = frozenset({"clock", "power", "thermal", "hw_slowdown", "nvlink", "pcie"})
# For a GPU's first sample, how far back an XID still belongs to it.
XID_FIRST_SAMPLE_LOOKBACK_S = 60.0
NEVER = float("-inf")
SWEEP_EVERY_S = 60.0  # sample time between two sweeps of a cluster for silent nodes
ROLE_GROUPS_KEPT = 4096
WINDOW_ITEMS = 120  # observations a window holds at most (at 1 s sampling keep_s would be 211)
# Whole observations older than full_s become past records in batches, once the oldest is this
# much older: every few instants a few at once, not a check and a conversion at every append.
AGE_SLACK_S = 15.0


@dataclass(slots=True)
class NodeInstant:
    """One node's sample at one instant, as stored."""

    cluster: str
    node: str
    labels: dict[str, str]
    ts: float
    gpu_rows: list[dict[str, Any]]
    nic_rows: list[dict[str, Any]]
    # XID events (xid, event ts) of the node's GPUs around this instant, by uuid.
    xids: dict[str, list[tuple[int, float]]] = field(default_factory=dict)


@dataclass(frozen=True)
class EpisodeChange:
    entity: str
    cause: str
    cluster: str
    node: str
    gpu: int | None
    uuid: str | None
    change: Change


# gc=False, as Window: what the engine keeps per GPU and port never leads back to itself, and
# the cyclic GC need not walk one object per GPU and port at each full collection.
class _Gpu(msgspec.Struct, gc=False, eq=False):
    window: Window = msgspec.field(default_factory=Window)
    prev: GpuPrev | None = None  # what the next sample's rates need of the last (observe.py)
    uuid: str | None = None  # as first seen: the one copy its observations share
    node: tuple[str, str] | None = None  # (cluster, node) it was last seen in
    absent: int = 0  # consecutive samples of its node that it was missing from
    absent_since: float | None = None
    recent: Recent = msgspec.field(default_factory=Recent)
    entity: str | None = None  # gpu_entity(uuid), made once


class _Nic(msgspec.Struct, gc=False, eq=False):
    window: Window = msgspec.field(default_factory=Window)
    prev: NicPrev | None = None
    recent: Recent = msgspec.field(default_factory=Recent)


@dataclass
class _Node:
    latest_ts: float
    judged_until: float = NEVER
    first_judged: float | None = None
    measured_until: dict[str, float] = field(default_factory=dict)  # by kind of window: the end of the last it measured
    small: bool = False  # at its latest instant, fewer than min_peers GPUs of some group (across_window.measure_gauges)
    pending: dict[float, NodeInstant] = field(default_factory=dict)
    gpus: set[str] = field(default_factory=set)
    nics: set[str] = field(default_factory=set)
    # (device, port) → (its NIC group, its entity, its namesake name, its device name as kept)
    ports: dict[tuple[str, int], tuple[str, str, str, str]] = field(default_factory=dict)


@dataclass
class _Cluster:
    nodes: dict[str, _Node] = field(default_factory=dict)
    max_ts: float = NEVER
    aligned: dict[str, AlignedWindows] = field(default_factory=dict)  # by kind of window (across_window.KINDS)
    resumed_until: float = NEVER  # the latest instant a node had been judged to before a restart
    first_ts: float = math.inf  # its earliest sample seen
    swept_at: float = NEVER  # max_ts at the last sweep for silent nodes
    waiting: set[str] = field(default_factory=set)  # nodes with samples pending


class Detector:
    def __init__(self, cfg: DetectionSettings, *, gpu_rules=None, nic_rules=None, screen: bool = True):
        self.cfg = cfg
        # The screen (server/detect/screen.py) knows the default rules' triggers only.
        self.screen = screen and gpu_rules is None and nic_rules is None
        self.gpu_rules = rules.GPU_RULES if gpu_rules is None else gpu_rules
        self.nic_rules = rules.NIC_RULES if nic_rules is None else nic_rules
        # How much sample time a window keeps: what a rule looks back over (rate_window_s), or what
        # an aligned window between nodes may still need (it ends up to stale_after_s plus one
        # window behind a node's newest sample, and starts one window earlier), whichever is
        # longer, plus one window to spare. At 5 s sampling 42 observations instead of 120.
        self.keep_s = max(cfg.rate_window_s, cfg.stale_after_s + 2 * cfg.across_window_s) + cfg.across_window_s
        # The default rules judge the newest observation whole and read only a few rates of the
        # older ones (model.GpuPast, NicPast keep those and what aligned windows read): whole
        # observations only until the window next ages, about a third of the memory. Rules
        # other than the default ones may look anywhere: whole observations throughout.
        self.full_s = 0.0 if gpu_rules is None and nic_rules is None else self.keep_s
        # The oldest whole observation that makes a window age (Window.age): full_s plus up to
        # AGE_SLACK_S, staggered across windows (Window.stagger) so that a fleet whose windows
        # filled together (a restart) does not age all at once in one evaluation.
        self.age_s = min(self.full_s + AGE_SLACK_S, self.keep_s)
        self.stagger_s = min(AGE_SLACK_S, self.keep_s - self.age_s)
        self._kinds = [(kind, kind.width(cfg)) for kind in KINDS]
        self.clusters: dict[str, _Cluster] = defaultdict(_Cluster)
        self.gpus: dict[str, _Gpu] = defaultdict(_Gpu)
        self.nics: dict[str, _Nic] = defaultdict(_Nic)
        self.conditions: dict[str, dict[str, Condition]] = defaultdict(dict)  # entity → cause → condition
        self.namesakes = NamesakeRates()  # link rate of each port name in each group, per node
        self._role_groups: dict[tuple[str, float], str] = {}  # (NIC group, link rate) → the ports' peer group
        self.late_samples = 0
        # Since the last drain_late(): (cluster, node) -> (samples, most seconds behind)
        self._late: dict[tuple[str, str], tuple[int, float]] = {}
        # Nodes judged further since the last drain_judged(): (cluster, node) -> judged until
        self._judged: dict[tuple[str, str], float] = {}

    # --- input --------------------------------------------------------------------------

    def add(self, item: NodeInstant) -> None:
        cluster = self.clusters[item.cluster]
        horizon = cluster.max_ts - self.cfg.lateness_s  # before this sample moves it
        node = self._node(item)
        if item.ts <= node.judged_until or item.ts < horizon:
            # Already judged, out of its node's order, or beyond the lateness allowance:
            # stored and served by the API, but not judged.
            self._count_late(item.cluster, item.node, 1, max(node.judged_until, horizon) - item.ts)
            return
        known = node.pending.get(item.ts)
        if known is None or len(item.gpu_rows) + len(item.nic_rows) >= len(known.gpu_rows) + len(known.nic_rows):
            node.pending[item.ts] = item
            cluster.waiting.add(item.node)

    def drop_if_late(self, cluster: str, node: str, min_ts: float, max_ts: float, samples: int) -> bool:
        """What add() would do with every instant of a stored batch that is wholly late
        (counted, not judged), done before its rows are read; False if any of it may be judged.
        A batch replayed hours late, or a spool beyond the lateness allowance, is then never
        read back at all (a 64,000-sample batch was 60 MiB and 3 s of CPU to drop)."""
        state = self.clusters.get(cluster)
        if state is None:
            return False
        known = state.nodes.get(node)  # None: new, or forgotten after a silence (_forget_silent)
        judged = known.judged_until if known is not None else NEVER
        horizon = state.max_ts - self.cfg.lateness_s  # this cycle's samples only move it later
        if not (max_ts <= judged or max_ts < horizon):
            return False
        if known is not None:
            known.latest_ts = max(known.latest_ts, max_ts)
        self._count_late(cluster, node, samples, max(judged, horizon) - min_ts)
        return True

    def _count_late(self, cluster: str, node: str, samples: int, behind: float) -> None:
        self.late_samples += samples
        count, worst = self._late.get((cluster, node), (0, 0.0))
        self._late[(cluster, node)] = (count + samples, max(worst, behind))

    def drain_late(self) -> dict[tuple[str, str], tuple[int, float]]:
        """Samples stored but not judged, per (cluster, node), since the last call: how many,
        and how far (sample time) behind what was judged or allowed the worst one was."""
        late, self._late = self._late, {}
        return late

    def drain_judged(self) -> dict[tuple[str, str], float]:
        """Nodes judged further since the last call, with their last judged instant."""
        judged, self._judged = self._judged, {}
        return judged

    def warm(self, item: NodeInstant) -> None:
        """Replay an instant that was judged before a restart: rebuild windows, judge nothing."""
        node = self._node(item)
        busy = any(o.busy for o in self._observe_gpus(item, node))
        self._observe_nics(item, busy, node)

    def judged_until(self) -> dict[str, float]:
        """Per cluster, the instant up to which every node still reporting has been judged."""
        out = {}
        for name, cluster in self.clusters.items():
            active = [n.judged_until for n in cluster.nodes.values() if n.latest_ts >= cluster.max_ts - self.cfg.stale_after_s]
            until = min(active, default=NEVER)
            if until > NEVER:
                out[name] = until
        return out

    def resume_at(self, cluster: str, node: str, judged_until: float) -> None:
        state = self.clusters[cluster].nodes.setdefault(node, _Node(latest_ts=judged_until))
        state.judged_until = max(state.judged_until, judged_until)
        state.latest_ts = max(state.latest_ts, judged_until)
        self.clusters[cluster].max_ts = max(self.clusters[cluster].max_ts, judged_until)
        self.clusters[cluster].resumed_until = max(self.clusters[cluster].resumed_until, judged_until)

    def mark_open(self, *, entity: str, cause: str, severity: str) -> None:
        """An episode found open in storage (after a restart) keeps its condition open."""
        cond = self._condition(entity, cause)
        cond.is_open, cond.severity = True, severity

    # --- judging ------------------------------------------------------------------------

    def advance(self) -> list[EpisodeChange]:
        changes: list[EpisodeChange] = []
        for cluster_name, cluster in self.clusters.items():
            for node_name in sorted(cluster.waiting):
                node = cluster.nodes[node_name]
                for ts in sorted(node.pending):
                    changes.extend(self._judge_node_instant(node, node.pending[ts]))
                    node.judged_until = ts
                    if node.first_judged is None:
                        node.first_judged = ts
                    for kind, width in self._kinds:
                        # A node with enough GPUs of each group for peers inside it takes part in
                        # gauge windows once a minute only (across_window.measure_gauges): the
                        # others are not even asked.
                        every = self.cfg.across_window_s if kind.big_nodes_each_minute and not node.small else width
                        if ts // every * every > node.measured_until.get(kind.name, NEVER):  # a window end passed since
                            self._measure(kind, width, every, cluster, node_name, node, ts)
                node.pending.clear()
                self._judged[(cluster_name, node_name)] = node.judged_until
            cluster.waiting.clear()
            for kind, width in self._kinds:
                changes.extend(self._judge_across(kind, width, cluster_name, cluster))
            self._forget_silent(cluster_name, cluster)
        return changes

    def _forget_silent(self, name: str, cluster: _Cluster) -> None:
        """Drop the windows of nodes silent for longer than the lateness allowance: nothing of
        theirs could be judged any more, and a fleet that churns node names (or an agent that
        invents them) must not grow the detector for ever. Open episodes keep their condition;
        a node that comes back starts afresh."""
        if cluster.max_ts - cluster.swept_at < SWEEP_EVERY_S:
            return
        cluster.swept_at = cluster.max_ts
        horizon = cluster.max_ts - self.cfg.lateness_s
        for node_name in [n for n, node in cluster.nodes.items() if node.latest_ts < horizon and not node.pending]:
            node = cluster.nodes.pop(node_name)
            for uuid in node.gpus:
                if self.gpus.get(uuid) is not None and self.gpus[uuid].node == (name, node_name):
                    del self.gpus[uuid]
            for key in node.nics:
                self.nics.pop(key, None)
            self.namesakes.forget(f"{name}/{node_name}")

    def _measure(self, kind: Kind, width: float, every: float, cluster: _Cluster, name: str, node: _Node, ts: float) -> None:
        """The node's share of every aligned window of this kind it has just been judged past (one,
        as a rule) that is not judged yet and whose samples it still holds; only those ending at a
        multiple of `every`."""
        aligned = cluster.aligned.get(kind.name)
        if aligned is None:
            start = math.floor(max(node.first_judged, cluster.resumed_until) / width) * width
            aligned = cluster.aligned[kind.name] = AlignedWindows(kind, width, start)
        measured = node.measured_until.get(kind.name, NEVER)
        ends = aligned.ends_to_measure(measured, ts, self.keep_s, each_s=every if every != width else None)
        if ends:
            members = NodeMembers(name, [self.gpus[u].window for u in node.gpus], [self.nics[k].window for k in node.nics])
            for end in ends:
                aligned.measures.setdefault(end, {})[name] = kind.measure(members, end - width, end, self.cfg)
        # Measured up to the last window end passed, or the last minute for a node asked once a
        # minute: the next is asked for once its instants pass the next one (advance).
        node.measured_until[kind.name] = max(measured, math.floor(ts / every) * every)

    def _starting(self, cluster: _Cluster, until: float) -> bool:
        """Whether a window falls in the cluster's first lateness allowance (not resumed from
        storage): which nodes it has is not known yet (the first pushes arrive in any order),
        so its windows wait for the whole allowance."""
        return cluster.resumed_until == NEVER and until < cluster.first_ts + self.cfg.lateness_s

    def _judge_across(self, kind: Kind, width: float, name: str, cluster: _Cluster) -> list[EpisodeChange]:
        """Nodes against nodes (server/detect/across.py), window by aligned window, once every
        node that may still bring its share has (or the lateness allowance has run out): the same
        windows with the same nodes in them, whatever order the nodes' samples arrive in."""
        lateness = self.cfg.lateness_s
        aligned = cluster.aligned.get(kind.name)
        changes = []
        while aligned is not None:
            start = aligned.until
            until = start + width
            if until > cluster.max_ts:
                break
            if cluster.max_ts < until + lateness and (self._starting(cluster, until)
                                                      or any(_awaited(node, until, lateness) for node in cluster.nodes.values())):
                break
            fresh, carried = aligned.take(until, self.cfg.across_window_s)
            if not fresh:
                continue
            for verdict in kind.judge(fresh, start, until, self.cfg, carried):
                findings = {verdict.cause: verdict.finding} if verdict.finding is not None else {}
                uuid, index = verdict.gpu or (None, None)
                entity = node_entity(name, verdict.node) if uuid is None else across_gpu_entity(uuid)
                changes += self._step(entity, findings, until, frozenset(), cluster=name,
                                      node=verdict.node, gpu=index, uuid=uuid, causes=(verdict.cause,))
        return changes

    def _node(self, item: NodeInstant) -> _Node:
        cluster = self.clusters[item.cluster]
        node = cluster.nodes.get(item.node)
        if node is None:
            node = cluster.nodes[item.node] = _Node(latest_ts=item.ts)
        node.latest_ts = max(node.latest_ts, item.ts)
        cluster.max_ts = max(cluster.max_ts, item.ts)
        cluster.first_ts = min(cluster.first_ts, item.ts)
        return node

    def _judge_node_instant(self, node: _Node, item: NodeInstant) -> list[EpisodeChange]:
        missing = node.gpus.difference(row["uuid"] for row in item.gpu_rows)
        # Slots of GPUs new to the node (before observing adds them), where one went missing.
        arrived = {row["index"] for row in item.gpu_rows if row["uuid"] not in node.gpus} if missing else set()
        gpus = self._observe_gpus(item, node)
        node_busy = any(o.busy for o in gpus)
        nics, keys = self._observe_nics(item, node_busy, node)
        changes = self._judge_gpus(item.ts, gpus)
        if missing:
            changes += self._judge_missing(node, item, missing, arrived)
        changes += self._judge_nics(item.ts, nics, keys)
        return changes

    def _observe_gpus(self, item: NodeInstant, node: _Node) -> list[GpuObs]:
        groups: dict[tuple, tuple[str, str]] = {}  # by model and workload: one node's GPUs share the rest of their group
        out, age_s, stagger_s, cluster, node_name = [], self.age_s, self.stagger_s, item.cluster, item.node
        at = item.ts  # one time object for the node instant's observations (each row has its own copy)
        where = (cluster, node_name)
        for row in item.gpu_rows:
            uuid, model, workload = row["uuid"], row["model"], row.get("workload")
            known = groups.get((model, workload))  # the group, and the model as the detector keeps it
            if known is None:
                group = canonical(peer_group(cluster=item.cluster, model=model, labels=item.labels, workload=workload))
                known = groups[(model, workload)] = (group, canonical(model))
            group, model = known
            state = self.gpus[uuid]
            if state.uuid is None:
                state.uuid = uuid
            xids = ()
            if item.xids:
                prev = state.prev
                since = prev.ts if prev is not None else item.ts - XID_FIRST_SAMPLE_LOOKBACK_S
                xids = tuple(x for x, at in item.xids.get(uuid, ()) if since < at <= item.ts)
            obs = gpu_obs(row, state, at, cluster, node_name, group, state.uuid, model, xids)
            state.node = where
            state.absent = 0
            window = state.window  # newest last, older kept as past, older than keep_s let go (inline: every GPU, every instant)
            recent = window.recent
            recent.append(obs)
            # Every few instants, a few at once (or at the cap: never drop a whole one silently, that
            # would leave a hole between the past and the recent ones).
            if recent[0].ts < obs.ts - age_s - window.stagger * stagger_s or len(recent) > WINDOW_ITEMS:
                window.age(obs.ts, self.full_s, self.keep_s, WINDOW_ITEMS, gpu_past)
            state.recent.note_gpu(obs)
            node.gpus.add(uuid)
            out.append(obs)
        node.small = len(out) < self.cfg.min_peers or (len(groups) > 1 and min(Counter(o.group for o in out).values()) < self.cfg.min_peers)
        return out

    def _observe_nics(self, item: NodeInstant, node_busy: bool, node: _Node) -> tuple[list[NicObs], list[str]]:
        """The ports' observations, and their entities in the same order."""
        group = nic_group(cluster=item.cluster, labels=item.labels)
        where = f"{item.cluster}/{item.node}"
        out, keys, age_s, stagger_s, ports, roles, cfg = [], [], self.age_s, self.stagger_s, node.ports, self._role_groups, self.cfg
        at = item.ts
        for row in item.nic_rows:
            device, port, rate = row["device"], row["port"], row["rate_gbps"]
            known = ports.get((device, port))  # its names, made once (every port, every instant)
            if known is None or known[0] != group:
                key = nic_entity(item.cluster, item.node, device, port)
                node.nics.add(key)
                known = ports[(device, port)] = (group, key, f"{group}|{device}|{port}", canonical(device))
            _, key, namesake, device = known
            state = self.nics[key]
            expected = self.namesakes.observe(namesake, where, rate)
            # A port's peers inside its node are the ports of the same role: the same link rate as
            # their namesakes on the other nodes (a 200 Gb/s storage NIC is no peer of the 400 Gb/s
            # compute rails, while a rail that trained down to 200 still is).
            role = expected if expected is not None else rate
            role_group = group if role is None else roles.get((group, role))
            if role_group is None:
                if len(roles) >= ROLE_GROUPS_KEPT:  # groups come and go with jobs
                    roles.clear()
                role_group = roles[(group, role)] = f"{group}|{role:g}"
            obs = nic_obs(row, state, at, item.cluster, item.node, role_group, device, node_busy)
            obs.expected_rate_gbps = expected
            window = state.window  # as in _observe_gpus
            recent = window.recent
            recent.append(obs)
            if recent[0].ts < obs.ts - age_s - window.stagger * stagger_s or len(recent) > WINDOW_ITEMS:  # as above
                window.age(obs.ts, self.full_s, self.keep_s, WINDOW_ITEMS, nic_past)
            state.recent.note_nic(obs, cfg)
            out.append(obs)
            keys.append(key)
        return out, keys

    def _judge_gpus(self, ts: float, fresh: list[GpuObs]) -> list[EpisodeChange]:
        stats = {group: gpu_peer_stats(group, members, min_peers=self.cfg.min_peers) for group, members in _by_group(fresh).items()}
        bounds = {group: gpu_bounds(peers, self.cfg) for group, peers in stats.items()} if self.screen else {}
        changes = []
        for obs in fresh:
            state = self.gpus[obs.uuid]
            window, peers, entity = state.window, stats[obs.group], state.entity or gpu_entity(obs.uuid)
            state.entity = entity
            if self.screen and entity not in self.conditions and not gpu_may_find(obs, bounds[obs.group], state.recent, self.cfg):
                continue  # no rule could find anything, and nothing is tracked to advance
            findings = {cause: explain(f, window, peers) for cause, f in _run(self.gpu_rules, window, peers, self.cfg).items()}
            neutral = JUDGED_ONLY_WHEN_BUSY if not obs.busy else frozenset()
            changes += self._step(entity, findings, ts, neutral, cluster=obs.cluster, node=obs.node, gpu=obs.index, uuid=obs.uuid)
        return changes

    def _judge_missing(self, node: _Node, item: NodeInstant, missing: set[str], arrived: set[int]) -> list[EpisodeChange]:
        """GPUs that stopped reporting while their node still reports. One whose slot a GPU new
        to the node took was replaced (an RMA swap while the node was down): it left the node."""
        changes = []
        ts = item.ts
        for uuid in missing:
            state = self.gpus[uuid]
            last = state.window.latest
            if last.index in arrived:
                changes += self._retire(node, uuid, last.index, item)
                continue
            state.absent += 1
            if state.absent == 1:
                state.absent_since = ts
            finding = None
            if state.absent >= self.cfg.missing_after_samples:
                # Counted in the node's own samples: absence from consecutive samples is
                # already the persistence, so the finding opens at once.
                finding = Finding(
                    cause="lost", severity="critical", immediate=True, onset=state.absent_since,
                    summary=f"GPU {last.index} missing from the last {state.absent} samples of node {item.node} "
                            f"(last seen {ts - last.ts:.0f} s before)",
                    evidence={"last_seen": last.ts, "missing_samples": state.absent, "silent_s": ts - last.ts},
                )
            changes += self._step(gpu_entity(uuid), {"lost": finding} if finding else {}, ts, frozenset(),
                                  cluster=item.cluster, node=item.node, gpu=last.index, uuid=uuid, causes=("lost",))
        return changes

    def _retire(self, node: _Node, uuid: str, index: int, item: NodeInstant) -> list[EpisodeChange]:
        """A replaced GPU leaves its node: forgotten, and what was open on it ends at the node's
        first sample without it. (Indices shift when a GPU vanishes from a node: the GPUs
        after it are known to the node, so a vanished GPU is never taken for a replaced one.)"""
        node.gpus.discard(uuid)
        del self.gpus[uuid]
        changes = []
        for entity in (gpu_entity(uuid), across_gpu_entity(uuid)):
            for cause, cond in self.conditions.pop(entity, {}).items():
                if cond.is_open:
                    changes.append(EpisodeChange(entity, cause, item.cluster, item.node, index, uuid, Resolved(resolved_at=item.ts)))
        return changes

    def _judge_nics(self, ts: float, fresh: list[NicObs], keys: list[str]) -> list[EpisodeChange]:
        stats = {group: nic_peer_stats(group, members, min_peers=self.cfg.min_peers) for group, members in _by_group(fresh).items()}
        bounds = {group: nic_bounds(peers, self.cfg) for group, peers in stats.items()} if self.screen else {}
        changes = []
        for obs, key in zip(fresh, keys):
            state, peers = self.nics[key], stats[obs.group]
            if self.screen and key not in self.conditions and not nic_may_find(obs, peers, bounds[obs.group], state.recent, self.cfg):
                continue
            window = state.window
            findings = {cause: explain(f, window, peers) for cause, f in _run(self.nic_rules, window, peers, self.cfg).items()}
            # A port of an idle node is judged only on what it shows by itself (state, errors).
            neutral = frozenset() if obs.node_busy else frozenset({"network"})
            changes += self._step(key, findings, ts, neutral, cluster=obs.cluster, node=obs.node, gpu=None, uuid=None)
        return changes

    def _step(self, entity: str, findings: dict[str, Finding], ts: float, neutral: frozenset[str], *, cluster: str, node: str,
              gpu: int | None, uuid: str | None, causes: tuple[str, ...] | None = None) -> list[EpisodeChange]:
        """Advance every tracked or newly found cause of one entity by one instant."""
        conditions = self.conditions[entity]
        tracked = set(conditions) if causes is None else set(causes) & set(conditions)
        changes = []
        for cause in tracked | set(findings):
            if cause in neutral and cause not in findings:
                conditions[cause].interrupt(ts)  # tracked: neutral causes are never new
                continue
            cond = self._condition(entity, cause)
            change = cond.step(ts, findings.get(cause))
            if change is not None:
                changes.append(EpisodeChange(entity, cause, cluster, node, gpu, uuid, change))
            if cond.idle:
                del conditions[cause]
        if not conditions:
            del self.conditions[entity]
        return changes

    def _condition(self, entity: str, cause: str) -> Condition:
        conditions = self.conditions[entity]
        cond = conditions.get(cause)
        if cond is None:
            cfg = self.cfg
            cond = conditions[cause] = Condition(n=cfg.window_n, k=cfg.window_k, clear_after=cfg.clear_after,
                                                 clear_after_s=cfg.clear_after_s, open_after_s=cfg.open_after_s)
        return cond


def _awaited(node: _Node, end: float, lateness: float) -> bool:
    """Whether a window ending at `end` waits for this node: judged to before its end, and heard
    from within the lateness allowance before it (a node silent longer is gone, not late)."""
    return node.judged_until < end and node.latest_ts >= end - lateness


def _by_group(observations: list) -> dict[str, list]:
    groups: dict[str, list] = defaultdict(list)
    for obs in observations:
        groups[obs.group].append(obs)
    return groups


def _run(rule_list, window: Window, peers, cfg: DetectionSettings) -> dict[str, Finding]:
    findings: dict[str, Finding] = {}
    for rule in rule_list:
        found = rule(window, peers, cfg)
        if found is not None and found.cause not in findings:
            findings[found.cause] = found
    return findings


def gpu_entity(uuid: str) -> str:
    return f"gpu:{uuid}"


def across_gpu_entity(uuid: str) -> str:
    """A GPU judged against other nodes over aligned windows: a condition of its own, apart from
    its judgements inside its node (which step every cause of gpu_entity at every instant)."""
    return f"gpu:{uuid}/across"


def nic_entity(cluster: str, node: str, device: str, port: int) -> str:
    return f"nic:{cluster}/{node}/{device}/{port}"


def node_entity(cluster: str, node: str) -> str:
    return f"node:{cluster}/{node}"
