"""Which replica exports the fleet-level series.

Every family of LaggardCollector is read from the shared database, so every replica would
answer a scrape with the whole fleet, and Prometheus scraping N replicas (the ServiceMonitor
selects every pod) would count every GPU, node and episode N times. Only the replica whose
process leads detection (server/detect/leader.py) exports them; the others serve their own
process_* and python_* series. A replica is every worker process behind one host:port (or
LAGGARD_REPLICA), so any worker of the leading replica answers a scrape the same way.

While no process leads (none has detection on, or during a takeover, at most
LAGGARD_DETECTOR__LEADER_RETRY_S after the old leader's lock session is gone), every replica exports:
a gap in the fleet's series would be worse than a scrape that, with three or more replicas,
may count it twice during those seconds."""

from __future__ import annotations

import logging
import time

from sqlalchemy import Engine

from agent.exposition import Family
from server.store.detector_state import leader_is

log = logging.getLogger(__name__)
CACHE_S = 1.0  # scrapes of several jobs or dashboards at once ask once


class FleetExporter:
    def __init__(self, engine: Engine, replica: str):
        self.engine, self.replica = engine, replica
        self._exports, self._asked_at = True, float("-inf")

    def exports(self) -> bool:
        now = time.monotonic()
        if now - self._asked_at >= CACHE_S:
            self._exports, self._asked_at = self._ask() is not False, now
        return self._exports

    def _ask(self) -> bool | None:
        try:
            with self.engine.connect() as conn:
                return leader_is(conn, self.replica)
        except Exception:  # the fleet families will report the database's failure themselves
            log.debug("metrics: cannot tell which replica leads", exc_info=True)
            return None

    def family(self, exports: bool) -> Family:
        fam = Family("laggard_fleet_exporter", "gauge",
                     "1 on the replica that exports the fleet-level series (the one leading detection), 0 on the others: "
                     "sum() over every scraped replica is 1.", ("replica",))
        fam.add((self.replica,), 1.0 if exports else 0.0)
        return fam
