"""The one wide sample record that flows from the readers to the wire (protocol v1).

Field names are the wire names of docs/protocol.md. Every metric is optional: None means
"not supported or not readable", never zero.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any

from agent.fields import GPU_READINGS, NIC_READINGS, Reading
from agent.workload.record import Workload

PROTOCOL_VERSION = 1


@dataclass(slots=True)
class XidEvent:
    xid: int
    ts: float


def _python_type(reading: Reading) -> Any:
    return reading.type if not reading.nullable else reading.type | None


def _record(name: str, identity: list[tuple], readings: tuple[Reading, ...], tail: list[tuple], doc: str) -> type:
    """A slotted dataclass: identity fields, then one field per reading of the table (None when
    not supported or not readable, never zero), then `tail`."""
    fields = [*identity, *((r.name, _python_type(r), field(default=r.default)) for r in readings), *tail]
    cls = dataclasses.make_dataclass(name, fields, slots=True)
    cls.__module__, cls.__doc__ = __name__, doc  # importable by name: pickle and repr find it here
    return cls


# The readings come from agent/fields.py; identity and the two non-readings are declared here.
GpuSample = _record(
    "GpuSample",
    [("index", int), ("uuid", str), ("model", str | None, field(default=None)), ("pci_bus_id", str | None, field(default=None))],
    GPU_READINGS,
    # What uses the GPU (issue #15, agent/workload/): None when unknown (attribution off or
    # failed); Workload(kind=None) when idle. Not a reading: not in GPU_METRIC_FIELDS.
    [("workload", Workload | None, field(default=None)), ("xids", list[XidEvent], field(default_factory=list))],
    "One GPU at one sampling cycle. `lost`: NVML reports the GPU lost or unreachable; the readings are then all None.",
)
NicSample = _record("NicSample", [("device", str), ("port", int)], NIC_READINGS, [], "One IB/RoCE port at one sampling cycle.")


@dataclass(slots=True)
class Sample:
    ts: float
    gpus: list[GpuSample] = field(default_factory=list)
    nics: list[NicSample] = field(default_factory=list)


GPU_METRIC_FIELDS: tuple[str, ...] = tuple(r.name for r in GPU_READINGS if r.name != "lost")


def sample_to_dict(sample: Sample) -> dict[str, Any]:
    return dataclasses.asdict(sample)


def build_batch(
    samples: list[Sample],
    *,
    node: str,
    cluster: str,
    labels: dict[str, str],
    agent_info: dict[str, str | None],
) -> dict[str, Any]:
    """The v1 request body for a batch of samples from one node."""
    return {
        "version": PROTOCOL_VERSION,
        "node": node,
        "cluster": cluster,
        "labels": labels,
        "agent": agent_info,
        "samples": [sample_to_dict(s) for s in samples],
    }



@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    # Fields this version does not know (written by a newer agent) are ignored; missing
    # ones (written by an older agent) take their defaults.
    names = _field_names(cls)
    return {k: v for k, v in data.items() if k in names}


def sample_from_dict(data: dict[str, Any]) -> Sample:
    """The inverse of sample_to_dict, for samples read back from the agent's spool.

    Raises ValueError when the dict is not a v1 sample (not a dict, no ts, a GPU without
    index/uuid, ...)."""
    try:
        gpus = []
        for g in data.get("gpus") or []:
            fields = _known(GpuSample, g)
            fields["xids"] = [XidEvent(**_known(XidEvent, x)) for x in g.get("xids") or []]
            workload = g.get("workload")
            fields["workload"] = Workload(**_known(Workload, workload)) if isinstance(workload, dict) else None
            gpus.append(GpuSample(**fields))
        nics = [NicSample(**_known(NicSample, n)) for n in data.get("nics") or []]
        return Sample(ts=float(data["ts"]), gpus=gpus, nics=nics)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a v1 sample: {type(exc).__name__}: {exc}") from None


def json_default(obj: object) -> dict[str, Any]:
    """json.dumps(default=...) for samples: a dataclass as a dict of its fields, shallow.

    The result equals json.dumps(sample_to_dict(sample)) at a fraction of the CPU:
    dataclasses.asdict deep-copies every field (it was most of the agent's encoding CPU)."""
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        raise TypeError(f"{type(obj).__name__} is not JSON serializable")
    return {name: getattr(obj, name) for name in _field_names(type(obj))}
