"""Prometheus exposition of the collector (issue #5, docs/observability.md): GET /metrics from a
custom collector that reads the database at scrape time (collector.py), counters shared by all
workers through the database (counters.py, maintainer.py), ingest request timing (ingest.py)."""
