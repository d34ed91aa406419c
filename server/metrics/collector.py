"""The collector's Prometheus metrics, read from the database at scrape time.

Nothing here lives in process memory between scrapes: every family is built from what is
stored (latest samples, open episodes, the shared counters, the detector's progress, the alert
outbox), so any worker process or replica answers a scrape with the same numbers. The only
per-process series are process_* and python_* (server/api/metrics.py).

LaggardCollector is a prometheus_client custom collector (collect() yields its metric
families), so it can be registered in any CollectorRegistry. GET /metrics renders the same
families with agent.exposition.render, which writes 10,000 GPUs several times faster than
prometheus_client's generic writer (bench/metrics.py, docs/observability.md).
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

from sqlalchemy import Connection, Engine, select, text

from agent.dcgm_fields import FLEET_DCGM_LABELS, XID_FIELD, dcgm_families, dcgm_inputs, dcgm_labels, nic_families
from agent.exposition import Family
from server import __version__
from server.metrics.ingest import DURATION, KNOWN_REJECT_CODES, LATENCY_BUCKETS, REJECTED, format_le
from server.metrics.selection import WHOLE, Selection
from server.metrics.settings import MetricsSettings
from server.peer_groups import is_busy, peer_group, workload_job, workload_key
from server.store import counters, schema
from server.store.detector_state import backlog as backlog_of
from server.store.detector_state import bucket, holder_names
from server.store.driver_rows import driver_rows

log = logging.getLogger(__name__)

GpuSampleT, NicSampleT = schema.GpuSample.__table__, schema.NicSample.__table__
NodeT, EpisodeT = schema.Node.__table__, schema.Episode.__table__
GPU_LABELS = ("cluster", "node", "gpu", "uuid", "job_name")
# job_name: the attributed job (issue #15), "" (no label) where none. Not `job`: that is the scrape
# job's label, which honor_labels would let this overwrite. kube-state-metrics names a Job `job_name`.
_NO_POD = (None, None, None)  # namespace, pod, container of a GPU no Kubernetes pod is attributed to
_NO_WORKLOAD = (_NO_POD, "")  # (namespace, pod, container), job of a GPU nothing is attributed to
XID_LAST_HORIZON_S = 3600.0  # laggard_gpu_xid_last_timestamp_seconds: XIDs this recent
ACTIONS = ("ok", "rebalance", "avoid", "drain")
MAX_LABEL_CACHES = 64  # selections whose label tuples are kept between scrapes
PERF_CAUSES = frozenset({"thermal", "power", "clock", "hw_slowdown"})

# The columns a scrape reads (fewer columns, faster at 10,000 GPUs): what the DCGM fields are made
# of (dcgm_inputs), and what Laggard's own per-GPU series need.
_GPU_COLUMNS = [c.name for c in GpuSampleT.columns if c.name in {
    "ts", "lost", *dcgm_inputs(), "sm_clock_mhz", "sm_clock_max_mhz", "util_gpu_pct", "clocks_event_reasons", "nvlink_links_up",
    "nvlink_links_total", "nvlink_crc_errors_total",
}]
_NIC_COLUMNS = [c.name for c in NicSampleT.columns if c.name != "nic_id"]

# Counters kept in the database: help text and label order.
COUNTER_META: dict[str, tuple[str, tuple[str, ...]]] = {
    "laggard_episodes_opened_total": ("Straggler episodes opened.", ("cluster", "cause", "severity")),
    "laggard_episodes_escalated_total": ("Straggler episodes escalated from warning to critical.", ("cluster", "cause")),
    "laggard_episodes_resolved_total": ("Straggler episodes resolved.", ("cluster", "cause")),
    "laggard_ingest_samples_total": ("Node samples committed by ingest.", ("cluster",)),
    "laggard_ingest_batches_total": ("Request bodies (batches) committed by ingest.", ("cluster",)),
    "laggard_gpu_xid_errors_total": ("XID events reported per GPU and XID code.", ("cluster", "node", "gpu", "uuid", "xid")),
    REJECTED: ("Ingest requests answered with an error, by HTTP status.", ("code",)),
    "laggard_detector_late_samples_total": ("Node samples stored but not judged: at or before their node's last judged instant, "
                                            "or more than lateness_s behind their cluster's newest sample.", ("cluster",)),
    "laggard_ingest_gpu_conflicts_total": ("Batches refused (409) because another node holds one of their GPU UUIDs.", ("cluster",)),
    "laggard_alert_notifications_total": ("Alert notifications attempted, by receiver and result (sent, failed, dropped).",
                                          ("receiver", "result")),
    "laggard_alert_alerts_sent_total": ("Alerts delivered inside notifications, by receiver.", ("receiver",)),
}


def _sql_latest(dialect: str, kind: str, only: str | None = None) -> str:
    """Each GPU's (or port's) latest sample, one index probe per series on the primary key.
    `only`: "id" or "node_id", to read only the GPUs or ports (or those of the nodes) in the
    list bound to :ids, for a scrape that carries a slice of the fleet."""
    if kind == "gpu":
        inv, samples, key, cols, ident = "gpus", "gpu_samples", "gpu_id", _GPU_COLUMNS, 'i.id, i.node_id, i."index", i.uuid, i.model, i.pci_bus_id'
    else:
        inv, samples, key, cols, ident = "nics", "nic_samples", "nic_id", _NIC_COLUMNS, "i.id, i.node_id, i.device, i.port"
    picked = ", ".join(f's."{c}"' for c in cols)
    if dialect == "postgresql":
        inner = ", ".join(f'm."{c}"' for c in cols)
        where = "" if only is None else f" AND i.{only} = ANY(:ids)"
        return (f"SELECT {ident}, {picked} FROM {inv} i CROSS JOIN LATERAL "
                f"(SELECT {inner} FROM {samples} m WHERE m.{key} = i.id ORDER BY m.ts DESC LIMIT 1) s WHERE s.ts >= :cutoff{where}")
    # SQLite: CROSS JOIN keeps the inventory as the outer loop; max() on the (id, ts) key is one seek.
    where = "" if only is None else f" AND i.{only} IN (SELECT value FROM json_each(:ids))"
    return (f"SELECT {ident}, {picked} FROM {inv} i CROSS JOIN {samples} s ON s.{key} = i.id "
            f"AND s.ts = (SELECT max(m.ts) FROM {samples} m WHERE m.{key} = i.id) WHERE s.ts >= :cutoff{where}")


class LaggardCollector:
    """prometheus_client custom collector over the collector's database."""

    def __init__(self, engine: Engine, cfg: MetricsSettings, *, min_peers: int, receivers: Callable[[], list[str]] | None = None,
                 hints: Callable[[], dict[str, Any]] | None = None, clock: Callable[[], float] = time.time):
        """`min_peers`: the detector's (DetectionSettings.min_peers), so a peer deviation is shown
        where the detector would compute one."""
        self.engine = engine
        self.cfg = cfg
        self.min_peers = min_peers
        self.receivers = receivers or (lambda: [])
        self.hints_source = hints
        # Per selection (the whole fleet, or a slice a scrape job asks for): the label tuples of each
        # GPU and port, kept between scrapes (see _gpu_families).
        self._label_caches: dict[Selection, tuple[dict, dict]] = {}
        self.clock = clock
        self._sql = {(kind, only): _sql_latest(engine.dialect.name, kind, only) for kind in ("gpu", "nic") for only in (None, "id", "node_id")}
        self._hints_failed = False

    # --- the prometheus_client Collector protocol --------------------------------------------

    def describe(self) -> list:
        return []  # no collect() at registration: that would query the database

    def collect(self) -> Iterator[Any]:
        for fam in self.families():
            yield to_prometheus(fam)

    # --- the families ----------------------------------------------------------------------------

    def families(self, selection: Selection = WHOLE) -> list[Family]:
        """Every family, or those of one slice of the fleet (server/metrics/selection.py): the
        same series as the whole scrape's that live in the slice."""
        now = self.clock()
        with self.engine.connect() as conn:
            state = self._read(conn, now, selection)
        out: list[Family] = []
        build = Family("laggard_build_info", "gauge", "The collector's version.", ("version",))
        if selection.takes_unclustered:
            build.add((__version__,), 1)
        out.append(build)
        out += self._node_families(state, now)
        out += self._gpu_families(state)
        out.append(_xid_last_family([r for r in state["xid_last"] if selection.takes_node(r[0], r[1])], state["workloads"]))
        out += nic_families(state["nic_items"])
        out += self._episode_families(state)
        out += self._counter_families(state["counters"], selection)
        out += self._detection_families(state, now)
        out += self._alert_families(state, now)
        return out

    def _label_cache(self, selection: Selection) -> tuple[dict, dict]:
        caches = self._label_caches
        if selection not in caches and len(caches) >= MAX_LABEL_CACHES:
            caches.clear()  # more slices than any scrape config splits into: start over
        return caches.setdefault(selection, ({}, {}))

    def _read(self, conn: Connection, now: float, sel: Selection) -> dict[str, Any]:
        nodes = {r[0]: r for r in conn.execute(select(NodeT.c.id, NodeT.c.cluster, NodeT.c.name, NodeT.c.labels, NodeT.c.agent,
                                                      NodeT.c.last_seen)).all()}
        cutoff = now - self.cfg.max_sample_age_s
        workloads, peer_scopes = _latest_workloads(conn)
        if sel.whole:
            gpus = _fetch_plain(conn, self._sql[("gpu", None)], cutoff)
            nics = _fetch_plain(conn, self._sql[("nic", None)], cutoff)
        else:
            node_ids = [i for i, n in nodes.items() if sel.takes_node(n[1], n[2])]
            if sel.shards == 1:  # a GPU's peer group is within its cluster: the nodes of the clusters are the GPUs'
                gpus = _fetch_plain(conn, self._sql[("gpu", "node_id")], cutoff, node_ids)
            else:
                gpus = _fetch_plain(conn, self._sql[("gpu", "id")], cutoff, _gpu_ids_in(conn, nodes, peer_scopes, sel))
            nics = _fetch_plain(conn, self._sql[("nic", "node_id")], cutoff, node_ids)
        gpu_labels, nic_labels = self._label_cache(sel)
        nic_items = []
        cache, fresh = nic_labels, {}
        for row in nics:
            node = nodes.get(row[1])
            if node is not None:
                ident = (row[0], node[1], node[2], row[2], row[3])
                labels = fresh[ident] = cache.get(ident) or (node[1], node[2], row[2], str(row[3]))
                nic_items.append((labels, dict(zip(_NIC_COLUMNS, row[4:]))))
        nic_labels.clear()
        nic_labels.update(fresh)
        active = [dict(r) for r in conn.execute(select(
            EpisodeT.c.cluster, EpisodeT.c.node, EpisodeT.c.gpu, EpisodeT.c.uuid, EpisodeT.c.cause, EpisodeT.c.severity, EpisodeT.c.evidence,
        ).where(EpisodeT.c.resolved_at.is_(None))).mappings()]
        last_xid = dict(conn.execute(text(
            "SELECT x.gpu_id, max(x.xid) FROM xid_events x JOIN (SELECT gpu_id, max(ts) AS ts FROM xid_events GROUP BY gpu_id) m "
            "ON m.gpu_id = x.gpu_id AND m.ts = x.ts GROUP BY x.gpu_id")).all())
        xid_last = conn.execute(text(
            'SELECT n.cluster, n.name, g."index", g.uuid, x.xid, max(x.ts), g.id FROM xid_events x JOIN gpus g ON g.id = x.gpu_id '
            "JOIN nodes n ON n.id = g.node_id WHERE x.ts >= :since GROUP BY n.cluster, n.name, g.\"index\", g.uuid, x.xid, g.id"),
            {"since": now - XID_LAST_HORIZON_S}).all()
        progress = dict(conn.execute(text("SELECT key, value FROM detector_progress")).all())
        backlog = backlog_of(conn, progress)
        holders = holder_names(conn) if conn.dialect.name == "postgresql" else None
        pending = {r[0]: (r[1], r[2]) for r in conn.execute(text(
            "SELECT receiver, count(*), min(created_at) FROM alert_deliveries WHERE state = 'pending' GROUP BY receiver")).all()}
        return {
            "selection": sel, "gpu_labels": gpu_labels,
            "nodes": nodes, "gpus": gpus, "nic_items": nic_items, "active": active, "last_xid": last_xid, "xid_last": xid_last,
            "workloads": workloads, "peer_scopes": peer_scopes,
            "progress": progress,
            "backlog": backlog, "holders": holders, "pending": pending, "counters": counters.read_all(conn), "hints": self._hints(),
        }

    def _hints(self) -> dict[str, Any] | None:
        """The hints document (server/hints, handed in by the app): each GPU's capacity and each
        node's action. Without it (none handed in, or failing) both are derived here from the
        open episodes."""
        if self.hints_source is None:
            return None
        try:
            doc = self.hints_source()
        except Exception:
            if not self._hints_failed:
                log.exception("hints failed; capacity and node action are derived from episodes instead")
                self._hints_failed = True
            return None
        self._hints_failed = False
        return doc

    def _node_families(self, state: dict[str, Any], now: float) -> list[Family]:
        seen = Family("laggard_node_last_seen_timestamp_seconds", "gauge", "Sample time of the node's newest sample (Unix seconds).",
                      ("cluster", "node"))
        reporting: dict[str, int] = defaultdict(int)
        stale: dict[str, int] = defaultdict(int)
        sel: Selection = state["selection"]
        for _, cluster, name, _labels, _agent, last_seen in state["nodes"].values():
            if sel.takes_node(cluster, name):
                seen.add((cluster, name), last_seen)
            if now - last_seen <= self.cfg.node_stale_after_s:
                reporting[cluster] += 1
            else:
                stale[cluster] += 1
        rep = Family("laggard_nodes_reporting", "gauge", "Nodes whose newest sample is recent (within node_stale_after_s).", ("cluster",))
        st = Family("laggard_nodes_stale", "gauge", "Known nodes whose newest sample is older than node_stale_after_s.", ("cluster",))
        for cluster in sorted({n[1] for n in state["nodes"].values()}):
            if sel.takes_cluster_level(cluster):
                rep.add((cluster,), reporting[cluster])
                st.add((cluster,), stale[cluster])
        action = Family("laggard_node_action", "gauge", "1 for the node's current scheduling action (ok, rebalance, avoid, drain), else 0.",
                        ("cluster", "node", "action"))
        capacity = Family("laggard_node_capacity_ratio", "gauge",
                          "Expected throughput of the node relative to a healthy one (its slowest GPU or link), 0 to 1.", ("cluster", "node"))
        for (cluster, name), (act, cap) in sorted(self._node_actions(state).items()):
            if not sel.takes_node(cluster, name):
                continue
            for a in ACTIONS:
                action.add((cluster, name, a), int(a == act))
            capacity.add((cluster, name), cap)
        return [seen, rep, st, action, capacity]

    def _node_actions(self, state: dict[str, Any]) -> dict[tuple[str, str], tuple[str, float]]:
        out = {(n[1], n[2]): ("ok", 1.0) for n in state["nodes"].values()}
        hints = state["hints"]
        if hints is not None:
            for node in hints.get("nodes", ()):
                out[(node["cluster"], node["node"])] = (node["action"], float(node["capacity"]))
            return out
        caps = self._derived_capacity(state)
        for ep in state["active"]:
            key = (ep["cluster"], ep["node"])
            act, cap = out.get(key, ("ok", 1.0))
            worst = "drain" if ep["severity"] == "critical" else "avoid"
            if ACTIONS.index(worst) > ACTIONS.index(act):
                act = worst
            out[key] = (act, cap)
        for (cluster, node, _gpu), cap in caps.items():
            act, current = out.get((cluster, node), ("ok", 1.0))
            out[(cluster, node)] = (act, min(current, cap))
        return out

    def _derived_capacity(self, state: dict[str, Any]) -> dict[tuple[str, str, int], float]:
        """Without hints: a GPU's capacity from its open episodes' evidence (SM clock against the
        peers' for the performance causes; 0 for a lost GPU)."""
        caps: dict[tuple[str, str, int], float] = {}
        for ep in state["active"]:
            if ep["gpu"] is None:
                continue
            key = (ep["cluster"], ep["node"], ep["gpu"])
            evidence = ep["evidence"] or {}
            cap = 1.0
            if ep["cause"] == "lost":
                cap = 0.0
            elif ep["cause"] in PERF_CAUSES and isinstance(evidence.get("clock_deviation"), (int, float)):
                cap = min(1.0, max(0.0, 1.0 + evidence["clock_deviation"]))
            caps[key] = min(caps.get(key, 1.0), cap)
        return caps

    def _gpu_families(self, state: dict[str, Any]) -> list[Family]:
        nodes = state["nodes"]
        ratio, deviation, capacity, lost, links_up, links, crc = laggard_gpu = _laggard_gpu_families()
        dcgm_items = []
        xid = Family(XID_FIELD.name, XID_FIELD.type, XID_FIELD.help, FLEET_DCGM_LABELS)
        groups: dict[str, list[tuple[tuple[str, ...], float]]] = defaultdict(list)
        caps = self._gpu_capacity(state)
        last_xid = state["last_xid"]
        dcgm_on = self.cfg.dcgm_series
        add_lost, add_cap, add_ratio = lost.add, capacity.add, ratio.add
        add_up, add_links, add_crc, add_dcgm = links_up.add, links.add, crc.add, dcgm_items.append
        cache = state["gpu_labels"]
        fresh: dict[tuple, tuple[tuple[str, ...], tuple[str, ...]]] = {}
        group_of = _PeerGroupMembers(nodes, groups)
        workloads, peer_scope_of = state["workloads"], state["peer_scopes"].get
        for row in state["gpus"]:
            node = nodes.get(row[1])
            if node is None:
                continue
            cluster, hostname, driver = node[1], node[2], _driver_version(node[4])
            index, uuid, model, pci_bus_id = row[2], row[3], row[4], row[5]
            gpu = str(index)
            m = dict(zip(_GPU_COLUMNS, row[6:]))
            # The same label tuples from scrape to scrape: the renderer then finds its cached
            # line heads by identity (agent/exposition.py Renderer).
            pod, job = workloads.get(row[0], _NO_WORKLOAD)
            ident = (row[0], cluster, hostname, index, uuid, model, pci_bus_id, driver, pod, job)
            pair = fresh[ident] = cache.get(ident) or (
                (cluster, hostname, gpu, uuid, job),
                # As if the node's own exporter served them: instance = the node, and the pod using
                # the GPU (FLEET_DCGM_LABELS).
                (*dcgm_labels(index=index, uuid=uuid, model=model, hostname=hostname, cluster=cluster, pci_bus_id=pci_bus_id,
                              driver=driver), hostname, *(v or "" for v in pod)))
            labels, dlabels = pair
            is_lost = bool(m["lost"])
            add_lost(labels, int(is_lost))
            add_cap(labels, 0.0 if is_lost else caps.get((cluster, hostname, index), 1.0))
            if dcgm_on:
                add_dcgm((dlabels, {} if is_lost else m))
                if row[0] in last_xid:
                    xid.add(dlabels, last_xid[row[0]])
            if is_lost:
                continue
            sm, sm_max = m["sm_clock_mhz"], m["sm_clock_max_mhz"]
            if sm is not None and sm_max:
                r = sm / sm_max
                add_ratio(labels, r)
                util, reasons = m["util_gpu_pct"], m["clocks_event_reasons"]
                if is_busy(util, reasons):
                    group_of[(row[1], model, peer_scope_of(row[0]))].append((labels, r))
            if (v := m["nvlink_links_up"]) is not None:
                add_up(labels, v)
            if (v := m["nvlink_links_total"]) is not None:
                add_links(labels, v)
            if (v := m["nvlink_crc_errors_total"]) is not None:
                add_crc(labels, v)
        cache.clear()
        cache.update(fresh)
        _add_peer_deviation(deviation, groups, self.min_peers)
        return self._with_dcgm_families(list(laggard_gpu), dcgm_items, xid)

    def _gpu_capacity(self, state: dict[str, Any]) -> dict[tuple[str, str, int], float]:
        """Each GPU's capacity by (cluster, node, index): the hints' where there are hints, else
        derived from the open episodes. A GPU not in it has capacity 1."""
        hint_caps = self._hint_capacity(state)
        return self._derived_capacity(state) if hint_caps is None else hint_caps

    def _with_dcgm_families(self, out: list[Family], dcgm_items: list, xid: Family) -> list[Family]:
        if not self.cfg.dcgm_series:
            return out
        return dcgm_families(dcgm_items, extra=self.cfg.dcgm_extra_series, labelnames=FLEET_DCGM_LABELS) + [xid] + out

    @staticmethod
    def _hint_capacity(state: dict[str, Any]) -> dict[tuple[str, str, int], float] | None:
        hints = state["hints"]
        if hints is None:
            return None
        return {(n["cluster"], n["node"], g["index"]): float(g["capacity"]) for n in hints.get("nodes", ()) for g in n.get("gpus", ())}

    def _episode_families(self, state: dict[str, Any]) -> list[Family]:
        active = Family("laggard_straggler_active", "gauge",
                        "Open straggler episodes (1 per GPU and cause; a node-level cause such as an IB port counts its open episodes, "
                        "gpu empty; job: the job attributed to the GPU when the episode opened, else empty).",
                        ("cluster", "node", "gpu", "cause", "severity", "job_name"))
        counts: dict[tuple[str, ...], int] = defaultdict(int)
        for ep in state["active"]:
            if not state["selection"].takes_node(ep["cluster"], ep["node"]):
                continue
            evidence = ep["evidence"] if isinstance(ep["evidence"], dict) else {}
            job = evidence.get("job")
            counts[(ep["cluster"], ep["node"], "" if ep["gpu"] is None else str(ep["gpu"]), ep["cause"], ep["severity"],
                    job if isinstance(job, str) else "")] += 1
        for labels, n in sorted(counts.items()):
            active.add(labels, n)
        return [active]

    def _counter_families(self, rows: list[tuple[str, dict[str, str], float]], sel: Selection) -> list[Family]:
        by_name: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
        for name, labels, value in rows:
            by_name[name].append((labels, value))
        out: list[Family] = []
        # Known label sets start at 0, so that rate() has a series before the first event.
        self._zero(by_name, REJECTED, [{"code": str(code)} for code in KNOWN_REJECT_CODES])
        receivers = self.receivers()
        self._zero(by_name, "laggard_alert_notifications_total",
                   [{"receiver": r, "result": result} for r in receivers for result in ("sent", "failed", "dropped")])
        self._zero(by_name, "laggard_alert_alerts_sent_total", [{"receiver": r} for r in receivers])
        for name in sorted(by_name):
            if name.startswith(DURATION):
                continue
            help_text, order = COUNTER_META.get(name, ("Laggard counter.", ()))
            entries = by_name[name] if sel.whole else [e for e in by_name[name] if sel.takes_labels(e[0])]
            labelnames = order or tuple(sorted({k for labels, _ in entries for k in labels}))
            if not name.endswith("_total"):
                continue  # not a counter we know how to expose
            fam = Family(name, "counter", help_text, labelnames)
            for labels, value in sorted(entries, key=lambda e: tuple(e[0].get(k, "") for k in labelnames)):
                fam.add(tuple(labels.get(k, "") for k in labelnames), value)
            out.append(fam)
        histogram = self._latency_histogram(by_name)
        if not sel.takes_unclustered:
            histogram.hist.clear()
        out.append(histogram)
        return out

    @staticmethod
    def _zero(by_name: dict[str, list[tuple[dict[str, str], float]]], name: str, label_sets: list[dict[str, str]]) -> None:
        present = {tuple(sorted(labels.items())) for labels, _ in by_name[name]}
        by_name[name] += [(labels, 0.0) for labels in label_sets if tuple(sorted(labels.items())) not in present]
        if not by_name[name]:
            del by_name[name]

    @staticmethod
    def _latency_histogram(by_name: dict[str, list[tuple[dict[str, str], float]]]) -> Family:
        fam = Family(DURATION, "histogram", "Time to answer POST /api/v1/samples, commit included (every worker and replica).")
        got = {labels["le"]: v for labels, v in by_name.get(f"{DURATION}_bucket", ())}
        buckets = [(le, got.get(format_le(le), 0.0)) for le in LATENCY_BUCKETS]
        total = sum(v for _, v in by_name.get(f"{DURATION}_sum", ()))
        count = sum(v for _, v in by_name.get(f"{DURATION}_count", ()))
        fam.add_histogram((), buckets, total, count)
        return fam

    def _detection_families(self, state: dict[str, Any], now: float) -> list[Family]:
        lag = Family("laggard_detection_lag_seconds", "gauge",
                     "Wall-clock time now minus the sample time the detector has judged up to, per cluster.", ("cluster",))
        sel: Selection = state["selection"]
        for key, value in sorted(state["progress"].items()):
            if key.startswith("judged_until:") and math.isfinite(value) and sel.takes_cluster_level(key.removeprefix("judged_until:")):
                lag.add((key.removeprefix("judged_until:"),), max(0.0, now - value))
        backlog = Family("laggard_detection_backlog_batches", "gauge", "Committed batches the detector has not read yet.")
        if sel.takes_unclustered:
            backlog.add((), state["backlog"] or 0)
        if state["holders"] is None:
            return [lag, backlog]
        holder = Family("laggard_detection_lease_holder", "gauge",
                        "1 per cluster: the replica (application_name of its lock session) whose detector judges it; "
                        "replica=\"\" at 0 while no replica holds the cluster's lease (PostgreSQL).", ("cluster", "replica"))
        for cluster in sorted({n[1] for n in state["nodes"].values()}):
            if not sel.takes_cluster_level(cluster):
                continue
            name = state["holders"].get(bucket(cluster))
            holder.add((cluster, name or ""), 0 if name is None else 1)
        return [lag, backlog, holder]

    def _alert_families(self, state: dict[str, Any], now: float) -> list[Family]:
        pending = Family("laggard_alert_deliveries_pending", "gauge", "Alert deliveries waiting to be sent (or retried), by receiver.",
                         ("receiver",))
        oldest = Family("laggard_alert_oldest_pending_age_seconds", "gauge", "Age of the oldest undelivered alert, by receiver.",
                        ("receiver",))
        if not state["selection"].takes_unclustered:
            return [pending, oldest]
        names = sorted(set(self.receivers()) | set(state["pending"]))
        for name in names:
            n, first = state["pending"].get(name, (0, None))
            pending.add((name,), n)
            oldest.add((name,), 0.0 if first is None else max(0.0, now - first))
        return [pending, oldest]


def _laggard_gpu_families() -> tuple[Family, ...]:
    """Laggard's own per-GPU families, empty, in exposition order: ratio, deviation, capacity,
    lost, NVLink links up, links, CRC errors."""
    return (
        Family("laggard_gpu_sm_clock_ratio", "gauge", "SM clock as a fraction of its maximum (latest sample).", GPU_LABELS),
        Family("laggard_gpu_peer_deviation_ratio", "gauge",
               "SM clock ratio relative to the median of its busy peers (same cluster, model and job), minus 1: "
               "-0.12 is 12% slower. Busy GPUs in groups of at least min_peers only.", GPU_LABELS),
        Family("laggard_gpu_capacity_ratio", "gauge",
               "Expected throughput of the GPU relative to a healthy peer, 0 to 1 (scheduler hints).", GPU_LABELS),
        Family("laggard_gpu_lost", "gauge", "1 when NVML reports the GPU lost or unreachable.", GPU_LABELS),
        Family("laggard_gpu_nvlink_links_up", "gauge", "NVLink links active.", GPU_LABELS),
        Family("laggard_gpu_nvlink_links", "gauge", "NVLink links the GPU has.", GPU_LABELS),
        Family("laggard_gpu_nvlink_crc_errors_total", "counter", "NVLink CRC errors (flit and data), all links.", GPU_LABELS),
    )


def _driver_version(agent: Any) -> str | None:
    """The driver version in a node's stored agent info (the `agent` object of its latest batch,
    docs/protocol.md), None where the agent did not say."""
    driver = agent.get("driver") if isinstance(agent, dict) else None
    return driver if isinstance(driver, str) else None


def _xid_last_family(rows: list[tuple], workloads: dict[int, tuple]) -> Family:
    """When each GPU last reported each XID code. A counter cannot alert on a GPU's first XID: its
    series is born at 1, and increase() over a series' first sample is 0 (issue #16); "the
    last one was less than 10 minutes ago" can."""
    fam = Family("laggard_gpu_xid_last_timestamp_seconds", "gauge",
                 f"Time (epoch seconds) of the GPU's latest XID of this code, for XIDs of the last {XID_LAST_HORIZON_S // 3600:.0f} h.",
                 (*GPU_LABELS, "xid"))
    for cluster, node, index, uuid, xid, ts, gpu_id in sorted(rows):
        fam.add((cluster, node, str(index), uuid, workloads.get(gpu_id, _NO_WORKLOAD)[1], str(xid)), ts)
    return fam


def _latest_workloads(conn: Connection) -> tuple[dict[int, tuple], dict[int, str]]:
    """Each GPU's latest workload (gpu_workloads holds changes), by GPU id: the pod's labels for
    the DCGM series and the job's name (as the API's ?job= filter names it) for Laggard's own;
    and, apart, its peer-group scope (workload_key) for GPUs a job is attributed to."""
    workloads: dict[int, tuple] = {}
    peer_scopes: dict[int, str] = {}
    for gpu_id, kind, namespace, pod, container, job, slurm_job_id in conn.execute(text(
            "SELECT w.gpu_id, w.kind, w.namespace, w.pod, w.container, w.job, w.slurm_job_id FROM gpu_workloads w "
            "JOIN (SELECT gpu_id, max(ts) AS ts FROM gpu_workloads GROUP BY gpu_id) m ON m.gpu_id = w.gpu_id AND m.ts = w.ts")):
        job_name = workload_job(kind, job=job, pod=pod, slurm_job_id=slurm_job_id) or ""
        pod_labels = (namespace, pod, container) if kind == "k8s" else _NO_POD
        if job_name or pod_labels != _NO_POD:
            workloads[gpu_id] = (pod_labels, job_name)
        scope = workload_key(kind, namespace=namespace, job=job, pod=pod, slurm_job_id=slurm_job_id)
        if scope is not None:
            peer_scopes[gpu_id] = scope
    return workloads, peer_scopes


class _PeerGroupMembers(dict):
    """(node id, model, workload scope) -> the member list of its peer group in `groups`. The
    peer group is worked out on the first GPU of each node, model and workload only, not on
    every GPU."""

    def __init__(self, nodes: dict[int, Any], groups: dict[str, list]):
        super().__init__()
        self.nodes, self.groups = nodes, groups

    def __missing__(self, key: tuple[int, str | None, str | None]) -> list:
        node_id, model, workload = key
        node = self.nodes[node_id]
        # Peers as the detector's (server/detect/engine.py): same cluster, model and attributed
        # workload, the node's labels only where nothing is attributed; else a dashboard would
        # show a GPU's deviation from another job's GPUs, which the detector never compares it with.
        group = peer_group(cluster=node[1], model=model, labels=node[3] or {}, workload=workload)
        members = self[key] = self.groups[group]
        return members


def _add_peer_deviation(deviation: Family, groups: dict[str, list[tuple[tuple[str, ...], float]]], min_peers: int) -> None:
    """Each busy GPU's SM clock ratio against its peer group's median, minus 1; groups smaller
    than min_peers (and than 2) have no median worth comparing to."""
    for members in groups.values():
        if len(members) < max(min_peers, 2):
            continue
        median = statistics.median(r for _, r in members)
        if median > 0:
            deviation.keys += [labels for labels, _ in members]
            deviation.values += [r / median - 1.0 for _, r in members]


def _fetch_plain(conn: Connection, sql: str, cutoff: float, ids: list[int] | None = None) -> list[tuple]:
    """Rows as the driver's plain tuples: at 10,000 GPUs, SQLAlchemy's Row objects cost more than
    the query. (Booleans stay 0/1 on SQLite, which every reader here treats alike.) `ids`: the
    list a sliced query binds to :ids (an array on PostgreSQL, JSON for SQLite's json_each)."""
    params: dict[str, Any] = {"cutoff": cutoff}
    if conn.dialect.name == "postgresql":
        sql = sql.replace(":cutoff", "%(cutoff)s").replace(":ids", "%(ids)s")
        params["ids"] = ids
    else:
        params["ids"] = json.dumps(ids)
    return driver_rows(conn, sql, params)


def _gpu_ids_in(conn: Connection, nodes: dict[int, Any], peer_scopes: dict[int, str], sel: Selection) -> list[int]:
    """The GPUs whose series live in a sharded slice: those whose peer group falls in its shard
    (server/metrics/selection.py), worked out once per node, model and workload."""
    takes: dict[tuple[int, str | None, str | None], bool] = {}
    out = []
    for gpu_id, node_id, model in conn.execute(text("SELECT id, node_id, model FROM gpus")):
        node = nodes.get(node_id)
        if node is None or not sel.takes_cluster(node[1]):
            continue
        key = (node_id, model, peer_scopes.get(gpu_id))
        if key not in takes:
            group = peer_group(cluster=node[1], model=model, labels=node[3] or {}, workload=key[2])
            takes[key] = sel.takes_peer_group(node[1], group)
        if takes[key]:
            out.append(gpu_id)
    return out


def to_prometheus(fam: Family):
    """A Family as a prometheus_client metric family."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, UnknownMetricFamily

    names = list(fam.labelnames)
    if fam.type == "histogram":
        out = HistogramMetricFamily(fam.name, fam.help, labels=names)
        for values, buckets, sum_value, _count in fam.hist:
            out.add_metric(list(values), [(format_le(le), v) for le, v in buckets], sum_value)
        return out
    cls = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily, "untyped": UnknownMetricFamily}[fam.type]
    out = cls(fam.name, fam.help, labels=names)
    for values, value in fam.rows:
        out.add_metric(list(values), value)
    return out

