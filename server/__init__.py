"""Laggard collector: ingest, storage, straggler detection and the APIs around them."""

__version__ = "0.1.0"
