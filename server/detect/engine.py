"""The detector: windows per GPU and port, peer statistics per instant, rules, persistence.

It runs on sample time only. Each cluster has a watermark: the oldest latest-sample time of
its active nodes (those that reported within `stale_after_s` of the newest sample). An instant
is judged once the watermark has passed it, so every node's sample for that instant is in and
the outcome does not depend on arrival order: a replayed trace gives the flags live data gave.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from server.detect import rules
from server.detect.model import Finding, GpuObs, NicObs, Window
from server.detect.observe import gpu_obs, nic_group, nic_obs, peer_group
from server.detect.peers import gpu_peer_stats, nic_peer_stats
from server.detect.persistence import Change, Condition
from server.detect.settings import DetectionSettings

# Performance causes are about a busy GPU running slow: an idle instant with nothing found
# neither confirms nor clears them, so a checkpoint pause does not split one fault into two
# episodes. (What a rule does find on an idle GPU, e.g. a node-wide HW power brake that
# stalled it, still counts.)
JUDGED_ONLY_WHEN_BUSY = frozenset({"clock", "power", "thermal", "hw_slowdown", "nvlink", "pcie"})
# For a GPU's first sample, how far back an XID still belongs to it.
XID_FIRST_SAMPLE_LOOKBACK_S = 60.0


@dataclass
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


@dataclass
class _Gpu:
    window: Window = field(default_factory=Window)
    prev_row: dict[str, Any] | None = None
    absent: int = 0  # consecutive samples of its node that it was missing from
    absent_since: float | None = None


@dataclass
class _Nic:
    window: Window = field(default_factory=Window)
    prev_row: dict[str, Any] | None = None


@dataclass
class _Node:
    latest_ts: float
    gpus: set[str] = field(default_factory=set)


@dataclass
class _Cluster:
    nodes: dict[str, _Node] = field(default_factory=dict)
    pending: dict[float, list[NodeInstant]] = field(default_factory=lambda: defaultdict(list))
    judged_until: float = float("-inf")
    max_ts: float = float("-inf")
    first_ts: float = float("inf")


class Detector:
    def __init__(self, cfg: DetectionSettings, *, gpu_rules=None, nic_rules=None):
        self.cfg = cfg
        self.gpu_rules = rules.GPU_RULES if gpu_rules is None else gpu_rules
        self.nic_rules = rules.NIC_RULES if nic_rules is None else nic_rules
        self.clusters: dict[str, _Cluster] = defaultdict(_Cluster)
        self.gpus: dict[str, _Gpu] = defaultdict(_Gpu)
        self.nics: dict[str, _Nic] = defaultdict(_Nic)
        self.groups: dict[str, set[str]] = defaultdict(set)  # peer group → GPU uuids
        self.nic_groups: dict[str, set[str]] = defaultdict(set)
        self.conditions: dict[str, dict[str, Condition]] = defaultdict(dict)  # entity → cause → condition
        self.late_samples = 0
        # Since the last drain_late(): (cluster, node) -> (samples, most seconds behind judged_until)
        self._late: dict[tuple[str, str], tuple[int, float]] = {}

    # --- input --------------------------------------------------------------------------

    def add(self, item: NodeInstant) -> None:
        cluster = self.clusters[item.cluster]
        node = cluster.nodes.setdefault(item.node, _Node(latest_ts=item.ts))
        node.latest_ts = max(node.latest_ts, item.ts)
        cluster.max_ts = max(cluster.max_ts, item.ts)
        cluster.first_ts = min(cluster.first_ts, item.ts)
        if item.ts <= cluster.judged_until:
            # Arrived after its instant was judged (a node that joined late, or a back-fill
            # past the lateness allowance): stored and served by the API, but not judged.
            self.late_samples += 1
            count, behind = self._late.get((item.cluster, item.node), (0, 0.0))
            self._late[(item.cluster, item.node)] = (count + 1, max(behind, cluster.judged_until - item.ts))
            return
        cluster.pending[item.ts].append(item)

    def drain_late(self) -> dict[tuple[str, str], tuple[int, float]]:
        """Samples that arrived after their instant was judged, per (cluster, node), since the
        last call: how many, and how far (sample time) behind the judged instant the worst was."""
        late, self._late = self._late, {}
        return late

    def warm(self, item: NodeInstant) -> None:
        """Replay an instant that was judged before a restart: rebuild windows, judge nothing."""
        cluster = self.clusters[item.cluster]
        node = cluster.nodes.setdefault(item.node, _Node(latest_ts=item.ts))
        node.latest_ts = max(node.latest_ts, item.ts)
        obs = [self._observe_gpu(item, row, node) for row in item.gpu_rows]
        busy = any(o.busy for o in obs)
        for row in item.nic_rows:
            self._observe_nic(item, row, busy)

    def judged_until(self) -> dict[str, float]:
        return {name: c.judged_until for name, c in self.clusters.items() if c.judged_until > float("-inf")}

    def resume_at(self, cluster: str, judged_until: float) -> None:
        self.clusters[cluster].judged_until = judged_until

    def mark_open(self, *, entity: str, cause: str, severity: str) -> None:
        """An episode found open in storage (after a restart) keeps its condition open."""
        cond = self._condition(entity, cause)
        cond.is_open, cond.severity = True, severity

    # --- judging ------------------------------------------------------------------------

    def advance(self) -> list[EpisodeChange]:
        changes: list[EpisodeChange] = []
        for name, cluster in self.clusters.items():
            mark = self._watermark(cluster)
            for ts in sorted(t for t in cluster.pending if t <= mark):
                changes.extend(self._judge_instant(cluster, ts, cluster.pending.pop(ts)))
                cluster.judged_until = ts
        return changes

    def _watermark(self, cluster: _Cluster) -> float:
        if cluster.judged_until == float("-inf") and cluster.max_ts - cluster.first_ts < self.cfg.settle_s:
            # A cluster we have just started to hear from: wait until every node has had the
            # chance to send its first batch, or the first instants would be judged without it.
            return float("-inf")
        active = [n.latest_ts for n in cluster.nodes.values() if n.latest_ts >= cluster.max_ts - self.cfg.stale_after_s]
        return min(active, default=float("-inf"))

    def _judge_instant(self, cluster: _Cluster, ts: float, items: list[NodeInstant]) -> list[EpisodeChange]:
        fresh_gpus: list[GpuObs] = []
        fresh_nics: list[NicObs] = []
        for item in items:
            node = cluster.nodes[item.node]
            obs = [self._observe_gpu(item, row, node) for row in item.gpu_rows]
            fresh_gpus.extend(obs)
            node_busy = any(o.busy for o in obs)
            fresh_nics.extend(self._observe_nic(item, row, node_busy) for row in item.nic_rows)
        changes = self._judge_gpus(ts, fresh_gpus)
        changes += self._judge_missing(cluster, ts, items)
        changes += self._judge_nics(ts, fresh_nics)
        return changes

    def _observe_gpu(self, item: NodeInstant, row: dict[str, Any], node: _Node) -> GpuObs:
        uuid = row["uuid"]
        state = self.gpus[uuid]
        group = peer_group(cluster=item.cluster, model=row["model"], labels=item.labels)
        since = state.prev_row["ts"] if state.prev_row is not None else item.ts - XID_FIRST_SAMPLE_LOOKBACK_S
        xids = tuple(x for x, at in item.xids.get(uuid, ()) if since < at <= item.ts)
        obs = gpu_obs(row, state.prev_row, group=group, xids=xids)
        state.prev_row = row
        state.absent = 0
        state.window.items.append(obs)
        node.gpus.add(uuid)
        self.groups[group].add(uuid)
        return obs

    def _observe_nic(self, item: NodeInstant, row: dict[str, Any], node_busy: bool) -> NicObs:
        key = nic_entity(item.cluster, item.node, row["device"], row["port"])
        state = self.nics[key]
        group = nic_group(cluster=item.cluster, labels=item.labels)
        obs = nic_obs(row, state.prev_row, group=group, node_busy=node_busy)
        state.prev_row = row
        state.window.items.append(obs)
        self.nic_groups[group].add(key)
        return obs

    def _judge_gpus(self, ts: float, fresh: list[GpuObs]) -> list[EpisodeChange]:
        stats = {}
        changes = []
        for obs in fresh:
            if obs.group not in stats:
                members = self._recent(self.gpus, self.groups[obs.group], ts)
                stats[obs.group] = gpu_peer_stats(obs.group, members, min_peers=self.cfg.min_peers)
            window = self.gpus[obs.uuid].window
            findings = _run(self.gpu_rules, window, stats[obs.group], self.cfg)
            neutral = JUDGED_ONLY_WHEN_BUSY if not obs.busy else frozenset()
            changes += self._step(gpu_entity(obs.uuid), findings, ts, neutral, cluster=obs.cluster, node=obs.node, gpu=obs.index, uuid=obs.uuid)
        return changes

    def _judge_missing(self, cluster: _Cluster, ts: float, items: list[NodeInstant]) -> list[EpisodeChange]:
        """A GPU that stopped reporting while its node still reports."""
        changes = []
        for item in items:
            reported = {row["uuid"] for row in item.gpu_rows}
            for uuid in cluster.nodes[item.node].gpus - reported:
                state = self.gpus[uuid]
                state.absent += 1
                if state.absent == 1:
                    state.absent_since = ts
                last = state.window.latest
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

    def _judge_nics(self, ts: float, fresh: list[NicObs]) -> list[EpisodeChange]:
        stats = {}
        changes = []
        for obs in fresh:
            if obs.group not in stats:
                members = self._recent(self.nics, self.nic_groups[obs.group], ts)
                stats[obs.group] = nic_peer_stats(obs.group, members, min_peers=self.cfg.min_peers)
            key = nic_entity(obs.cluster, obs.node, obs.device, obs.port)
            findings = _run(self.nic_rules, self.nics[key].window, stats[obs.group], self.cfg)
            # A port of an idle node is judged only on what it shows by itself (state, errors).
            neutral = frozenset() if obs.node_busy else frozenset({"network"})
            changes += self._step(key, findings, ts, neutral, cluster=obs.cluster, node=obs.node, gpu=None, uuid=None)
        return changes

    def _recent(self, states: dict, keys: set[str], ts: float) -> list:
        horizon = ts - self.cfg.stale_after_s
        out = []
        for key in keys:
            items = states[key].window.items
            if items and horizon <= items[-1].ts <= ts:
                out.append(items[-1])
        return out

    def _step(self, entity: str, findings: dict[str, Finding], ts: float, neutral: frozenset[str], *, cluster: str, node: str,
              gpu: int | None, uuid: str | None, causes: tuple[str, ...] | None = None) -> list[EpisodeChange]:
        """Advance every tracked or newly found cause of one entity by one instant."""
        conditions = self.conditions[entity]
        tracked = set(conditions) if causes is None else set(causes) & set(conditions)
        changes = []
        for cause in tracked | set(findings):
            if cause in neutral and cause not in findings:
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
            cond = conditions[cause] = Condition(
                n=self.cfg.window_n, k=self.cfg.window_k, clear_after=self.cfg.clear_after, clear_after_s=self.cfg.clear_after_s
            )
        return cond


def _run(rule_list, window: Window, peers, cfg: DetectionSettings) -> dict[str, Finding]:
    findings: dict[str, Finding] = {}
    for rule in rule_list:
        found = rule(window, peers, cfg)
        if found is not None and found.cause not in findings:
            findings[found.cause] = found
    return findings


def gpu_entity(uuid: str) -> str:
    return f"gpu:{uuid}"


def nic_entity(cluster: str, node: str, device: str, port: int) -> str:
    return f"nic:{cluster}/{node}/{device}/{port}"
