"""The collector's Prometheus metrics, read from the database at scrape time.

Nothing here lives in process memory between scrapes: every family is built from what is
stored (latest samples, open episodes, the shared counters, the detector's progress, the alert
outbox), so any worker process or replica answers a scrape with the same numbers. The only
per-process series are process_* and python_* (server/api/metrics.py).

LaggardCollector reads one snapshot of the database per scrape (families/snapshot.py) and hands
it to one small collector per group of families (server/metrics/families/). It is a
prometheus_client custom collector (collect() yields its metric families), so it can be
registered in any CollectorRegistry. GET /metrics renders the same families with
agent.exposition.render, which writes 10,000 GPUs several times faster than prometheus_client's
generic writer (bench/metrics.py, docs/observability.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from sqlalchemy import Engine

from agent.exposition import Family
from server.metrics.families.alerts import AlertOutbox
from server.metrics.families.build_info import BuildInfo
from server.metrics.families.contract import FamilyCollector
from server.metrics.families.detection import DetectorState
from server.metrics.families.episodes import ActiveStragglers
from server.metrics.families.gpu_dcgm import DcgmGpuReadings
from server.metrics.families.gpu_series import LaggardGpuSeries
from server.metrics.families.hints import NodeHints
from server.metrics.families.latest import sql_latest
from server.metrics.families.nodes import NodeLiveness
from server.metrics.families.ports import PortSeries
from server.metrics.families.snapshot import LabelCache, read_snapshot
from server.metrics.families.stored_counters import StoredCounters
from server.metrics.families.xids import XidLast
from server.metrics.ingest import format_le
from server.metrics.selection import WHOLE, Selection
from server.metrics.settings import MetricsSettings

log = logging.getLogger(__name__)

MAX_LABEL_CACHES = 64  # selections whose label tuples are kept between scrapes


class LaggardCollector:
    """prometheus_client custom collector over the collector's database."""

    def __init__(self, engine: Engine, cfg: MetricsSettings, *, min_peers: int, receivers: Callable[[], list[str]] | None = None,
                 hints: Callable[[], dict[str, Any]] | None = None, clock: Callable[[], float] = time.time):
        """`min_peers`: the detector's (DetectionSettings.min_peers), so a peer deviation is shown
        where the detector would compute one."""
        self.engine = engine
        self.cfg = cfg
        self.receivers = receivers or (lambda: [])
        self.hints_source = hints
        # Per selection (the whole fleet, or a slice a scrape job asks for): the label tuples of each
        # GPU and port, kept between scrapes (families/snapshot.py).
        self._label_caches: dict[Selection, LabelCache] = {}
        self.clock = clock
        self._sql = {(kind, only): sql_latest(engine.dialect.name, kind, only) for kind in ("gpu", "nic") for only in (None, "id", "node_id")}
        self._hints_failed = False
        # In exposition order.
        self.family_collectors: list[FamilyCollector] = [
            BuildInfo(), NodeLiveness(cfg.node_stale_after_s), NodeHints(), DcgmGpuReadings(cfg.dcgm_series, cfg.dcgm_extra_series),
            LaggardGpuSeries(min_peers), XidLast(), PortSeries(), ActiveStragglers(), StoredCounters(self.receivers), DetectorState(),
            AlertOutbox(self.receivers),
        ]

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
            snap = read_snapshot(conn, now, selection, max_sample_age_s=self.cfg.max_sample_age_s, sql=self._sql,
                                 label_cache=self._label_cache(selection))
            snap.hints = self._hints()
        out: list[Family] = []
        for collector in self.family_collectors:
            out += collector.collect(snap)
        return out

    def _label_cache(self, selection: Selection) -> LabelCache:
        caches = self._label_caches
        if selection not in caches and len(caches) >= MAX_LABEL_CACHES:
            caches.clear()  # more slices than any scrape config splits into: start over
        return caches.setdefault(selection, ({}, {}))

    def _hints(self) -> dict[str, Any] | None:
        """The hints document (server/hints, handed in by the app): each GPU's capacity and each
        node's action. Without it (none handed in, or failing) both are derived from the open
        episodes (families/hints.py)."""
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
