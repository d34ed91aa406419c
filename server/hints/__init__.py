"""Scheduler hints: episodes turned into ok / rebalance / avoid / drain and a capacity per node
and GPU (mapping.py, cooldown.py, compute.py), served from a short cache (service.py), spoken
as kube-scheduler's extender protocol (extender.py). Kept free of imports here: Settings
imports server.hints.settings."""
