"""Ingest: the agents' way in. A pushed body is read under a deadline, decoded and checked
against the protocol (server/protocol.py), admitted by the work it brings, and handed to the
writer (server/ingest/router.py)."""
