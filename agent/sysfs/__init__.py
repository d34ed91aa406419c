"""Readers for Linux sysfs (the InfiniBand / RoCE port counters)."""

from agent.sysfs.infiniband import read_ib_ports

__all__ = ["read_ib_ports"]
