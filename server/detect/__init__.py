"""Straggler detection: each GPU and node judged against its peers, over windows of samples.

Layers (node-problem-detector style: each sees only the one below):
  observations (model.py)  ← built from stored/ingested samples, rates from counter deltas
  windows + peer stats     ← per GPU/NIC history; robust per-group statistics per instant
  rules (rules/*.py)       ← pure functions: window + peers + settings → Finding | None
  persistence              ← k of the last n instants to open, m clean instants to clear
  episodes                 ← lasting conditions with onset/detected/resolved, stored
"""
