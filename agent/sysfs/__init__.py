"""Readers for Linux sysfs (the InfiniBand / RoCE port counters)."""

from agent.sysfs.infiniband import IbPorts, read_ib_ports

__all__ = ["IbPorts", "read_ib_ports"]
