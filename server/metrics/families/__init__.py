"""The collector's metric families, one small collector per group of families (node_exporter's shape).

Each collector has one method, collect(snapshot) -> Iterable[Family], and does no I/O: the
database is read once per scrape into a Snapshot (snapshot.py), which LaggardCollector
(server/metrics/collector.py) hands to each collector in exposition order.
"""
