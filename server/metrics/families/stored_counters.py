"""The counters kept in the database (episodes, ingest, XIDs, rejects, alerts) and the ingest
latency histogram: the same numbers from any worker or replica, and retention does not make them fall."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from agent.exposition import Family
from server.metrics.families.snapshot import Snapshot
from server.metrics.ingest import DURATION, KNOWN_REJECT_CODES, LATENCY_BUCKETS, REJECTED, format_le

ByName = dict[str, list[tuple[dict[str, str], float]]]

# Help text and label order of each counter.
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


class StoredCounters:
    def __init__(self, receivers: Callable[[], list[str]]):
        """`receivers`: the configured receivers' names, whose alert counters start at 0."""
        self.receivers = receivers

    def collect(self, snap: Snapshot) -> list[Family]:
        sel = snap.selection
        by_name: ByName = defaultdict(list)
        for name, labels, value in snap.counters:
            by_name[name].append((labels, value))
        out: list[Family] = []
        # Known label sets start at 0, so that rate() has a series before the first event.
        _zero(by_name, REJECTED, [{"code": str(code)} for code in KNOWN_REJECT_CODES])
        receivers = self.receivers()
        _zero(by_name, "laggard_alert_notifications_total",
              [{"receiver": r, "result": result} for r in receivers for result in ("sent", "failed", "dropped")])
        _zero(by_name, "laggard_alert_alerts_sent_total", [{"receiver": r} for r in receivers])
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
        histogram = _latency_histogram(by_name)
        if not sel.takes_unclustered:
            histogram.hist.clear()
        out.append(histogram)
        return out


def _zero(by_name: ByName, name: str, label_sets: list[dict[str, str]]) -> None:
    present = {tuple(sorted(labels.items())) for labels, _ in by_name[name]}
    by_name[name] += [(labels, 0.0) for labels in label_sets if tuple(sorted(labels.items())) not in present]
    if not by_name[name]:
        del by_name[name]


def _latency_histogram(by_name: ByName) -> Family:
    fam = Family(DURATION, "histogram", "Time to answer POST /api/v1/samples, commit included (every worker and replica).")
    got = {labels["le"]: v for labels, v in by_name.get(f"{DURATION}_bucket", ())}
    buckets = [(le, got.get(format_le(le), 0.0)) for le in LATENCY_BUCKETS]
    total = sum(v for _, v in by_name.get(f"{DURATION}_sum", ()))
    count = sum(v for _, v in by_name.get(f"{DURATION}_count", ()))
    fam.add_histogram((), buckets, total, count)
    return fam
