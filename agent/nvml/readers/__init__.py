"""The per-GPU readers, node_exporter style: one concern per module, one `read` each.

Contract: `read(handle, gpu: GpuSample) -> None` fills its own fields of `gpu`. A metric the
GPU does not support stays None (per-metric, via `optional`/`field_values`); a reader that
raises NVMLError_NotSupported as a whole leaves all its fields None. Any other exception is
the source's business: it counts it against this reader and moves on to the next one.

A `static` reader reads what is fixed while the GPU stays on the bus (identity, the board's
maximum clocks and PCIe link, how many NVLinks it has): the source runs it once per GPU
handle, keeps what it filled in, and copies that into every sample; a GPU looked up afresh
(lost and back) is read again. The static readers run before the others, which may use
their fields (nvlink reads the state of `nvlink_links_total` links).

A reader that needs state between sampling cycles (GPM metrics come from two samples) sets
`per_source`: each source calls it once for a Reader of its own (bind_readers), so two
sources never share that state, and calls that Reader's `close` when it closes.
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
    tensor_activity,
    utilization,
)
from agent.sample import GpuSample


class Reader(NamedTuple):
    name: str
    read: Callable[[Any, GpuSample], None]
    per_source: Callable[[], Reader] | None = None  # makes this reader's per-source instance
    close: Callable[[], None] | None = None  # frees what a per-source instance holds
    static: bool = False  # read once per GPU handle, then copied (see above)


def _stateful(name: str, factory: Callable[[], Any]) -> Reader:
    """A Reader whose state lives in a `factory()` object with read(handle, gpu) and close()."""

    def per_source() -> Reader:
        instance = factory()
        return Reader(name, instance.read, close=instance.close)

    def unbound(handle: Any, gpu: GpuSample) -> None:
        raise TypeError(f"reader {name!r} keeps state per source: bind_readers() first")

    return Reader(name, unbound, per_source=per_source)


def bind_readers(readers: list[Reader]) -> list[Reader]:
    """The readers one source runs: every stateful one replaced by an instance of its own."""
    return [r.per_source() if r.per_source is not None else r for r in readers]


# Explicit and ordered: identity first so a GPU that fails everything else still has its uuid.
READERS: list[Reader] = [
    Reader("identity", identity.read, static=True),
    Reader("clock_limits", clocks.read_max, static=True),
    Reader("pcie_limits", pcie.read_max, static=True),
    Reader("nvlink_count", nvlink.count_links, static=True),
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
    _stateful("tensor_activity", tensor_activity.TensorActivity),
]

__all__ = ["READERS", "Reader", "bind_readers"]
