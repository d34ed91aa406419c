"""Laggard node agent: reads NVML and sysfs, pushes samples to the collector."""

__version__ = "0.1.0"
