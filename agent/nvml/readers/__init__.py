"""The per-GPU readers, node_exporter style: one concern per module, one `read` each.

Contract: `read(handle, gpu: GpuSample) -> None` fills its own fields of `gpu`. A metric the
GPU does not support stays None (per-metric, via `optional`/`field_values`); a reader that
raises NVMLError_NotSupported as a whole leaves all its fields None. Any other exception is
the source's business: it counts it against this reader and moves on to the next one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from agent.nvml.readers import (
    clock_events,
    clocks,
    ecc,
    identity,
    memory,
    nvlink,
    pcie,
    power,
    remapped_rows,
    temperature,
    utilization,
)
from agent.sample import GpuSample


class Reader(NamedTuple):
    name: str
    read: Callable[[Any, GpuSample], None]


# Explicit and ordered: identity first so a GPU that fails everything else still has its uuid.
READERS: list[Reader] = [
    Reader("identity", identity.read),
    Reader("temperature", temperature.read),
    Reader("power", power.read),
    Reader("clocks", clocks.read),
    Reader("utilization", utilization.read),
    Reader("memory", memory.read),
    Reader("clock_events", clock_events.read),
    Reader("pcie", pcie.read),
    Reader("nvlink", nvlink.read),
    Reader("ecc", ecc.read),
    Reader("remapped_rows", remapped_rows.read),
]

__all__ = ["READERS", "Reader"]
