"""Wire protocol v1 (docs/protocol.md): what an agent may POST to /api/v1/samples.

Validation runs on the raw JSON bytes (pydantic-core), strict about types, so "5" is not a
temperature and NaN/Infinity are refused. Unknown fields are ignored so that newer agents can
talk to older collectors. The shapes are TypedDicts rather than models: ingest validates
every field of every GPU of every sample, and building plain dicts is about twice as fast as
building model instances (measured in docs/performance.md). Optional keys may be absent;
readers use .get() and the defaults named here.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, TypeAdapter, with_config
from typing_extensions import NotRequired, TypedDict

from agent.fields import GPU_READING_NAMES, GPU_READINGS, NIC_READING_NAMES, NIC_READINGS, Reading

# No control characters (C0 and DEL) in any text: PostgreSQL refuses NUL in text columns
# (stored on SQLite, a 500 on PostgreSQL), and a newline in a name forges log lines and Slurm
# reasons. Node and cluster names are fetched back as one URL path segment, so no "/" either.
# "^[^...]*$" is the one pattern form server/ingest/protocol_decoder.py carries over to msgspec.
PRINTABLE = r"^[^\x00-\x1f\x7f]*$"
PATH_SEGMENT = r"^[^\x00-\x1f\x7f/]*$"
# What a failed pattern means, in words (server/errors.py puts these in the error message).
# A full container id as runtimes write it (containerd, CRI-O, Docker): 64 lowercase hex digits.
CONTAINER_ID = r"^[0-9a-f]{64}$"
PATTERN_MEANINGS = {
    PRINTABLE: "must not contain control characters (U+0000-U+001F, U+007F)",
    PATH_SEGMENT: "must not contain control characters or '/' (it is looked up as one URL path segment)",
    CONTAINER_ID: "must be a full container id: 64 lowercase hex digits",
}
Name = Annotated[str, Field(min_length=1, max_length=253, pattern=PRINTABLE)]
PathName = Annotated[str, Field(min_length=1, max_length=253, pattern=PATH_SEGMENT)]
NonNeg = Annotated[float, Field(ge=0)]
Short = Annotated[str, Field(max_length=64, pattern=PRINTABLE)]
# The readings' physical ranges are in agent/fields.py.

# Per-request limits (besides the body size): a node has a few dozen GPUs and ports at most;
# an agent back-filling its spool sends at most MAX_SAMPLES samples per request.
MAX_SAMPLES = 1000
MAX_GPUS = 64
MAX_NICS = 64
MAX_XIDS = 256
MAX_LABELS = 32

_wire = with_config(ConfigDict(strict=True, allow_inf_nan=False, extra="ignore"))


@_wire
class Xid(TypedDict):
    xid: Annotated[int, Field(ge=0, le=65535)]
    ts: Annotated[float, Field(gt=0)]  # and not in the future (server/ingest/decode.py), like a sample's


# What uses a GPU (issue #15, agent/workload/): names as Kubernetes and Slurm allow them.
JobName = Annotated[str, Field(min_length=1, max_length=256, pattern=PRINTABLE)]


@_wire
class Workload(TypedDict, total=False):
    """The workload on one GPU, every key optional. kind null: idle (no process on the GPU); the
    whole object null (or absent): unknown. Stored as changes (server/store/workloads.py)."""

    kind: Literal["k8s", "slurm", "process"] | None
    job: JobName | None  # k8s: the pod's job (JobSet, Kubeflow, Volcano, Job, owner); Slurm: the job name
    namespace: Name | None
    pod: Name | None
    pod_uid: Short | None
    container: Name | None  # container name in the pod
    container_id: Annotated[str, Field(pattern=CONTAINER_ID)] | None
    slurm_job_id: Short | None
    slurm_step: Short | None
    user: JobName | None  # the Slurm job's user
    process: Name | None  # comm of the process holding most GPU memory
    pid: Annotated[int, Field(ge=0, le=2**31 - 1)] | None  # that process, host PID namespace
    processes: Annotated[int, Field(ge=0, le=65535)] | None  # processes on the GPU
    workloads: Annotated[int, Field(ge=0, le=65535)] | None  # distinct workloads on the GPU (> 1: shared)


def _wire_type(reading: Reading) -> Any:
    """A reading's wire type: its type within its physical range (agent/fields.py)."""
    if reading.type is bool:
        return bool
    if reading.type is str:
        return Annotated[str, Field(max_length=reading.max_length, pattern=PRINTABLE)]
    return Annotated[reading.type, Field(ge=reading.lo, le=reading.hi)]


def _wire_record(name: str, identity: dict[str, Any], readings: tuple[Reading, ...], tail: dict[str, Any]) -> Any:
    """A TypedDict: identity keys, then every reading of the table (optional; null: not supported
    or unreadable, except the non-nullable ones, which take their default when absent), then `tail`."""
    keys = dict(identity)
    for reading in readings:
        keys[reading.name] = NotRequired[_wire_type(reading) if not reading.nullable else _wire_type(reading) | None]
    return _wire(TypedDict(name, {**keys, **tail}))


# The readings come from agent/fields.py (new ones are appended there, absent from older agents);
# identity, the workload and the XIDs are declared here.
Gpu = _wire_record(
    "Gpu",
    {"index": Annotated[int, Field(ge=0, le=1023)], "uuid": Name,
     "model": NotRequired[Annotated[str, Field(max_length=128, pattern=PRINTABLE)] | None], "pci_bus_id": NotRequired[Short | None]},
    GPU_READINGS,
    # Not a reading: stored as changes in gpu_workloads, not as a gpu_samples column. Absent
    # (older agents): nothing stored; null: unknown.
    {"workload": NotRequired[Workload | None], "xids": NotRequired[Annotated[list[Xid], Field(max_length=MAX_XIDS)]]},  # xids default []
)
Nic = _wire_record("Nic", {"device": Name, "port": Annotated[int, Field(ge=0, le=255)]}, NIC_READINGS, {})


@_wire
class SampleIn(TypedDict):
    ts: Annotated[float, Field(gt=0)]
    gpus: NotRequired[Annotated[list[Gpu], Field(max_length=MAX_GPUS)]]  # default []
    nics: NotRequired[Annotated[list[Nic], Field(max_length=MAX_NICS)]]  # default []


@_wire
class AgentInfo(TypedDict, total=False):
    version: Short | None
    driver: Short | None
    cuda: Short | None
    boot_time: NonNeg | None  # epoch seconds the node booted (/proc/stat btime): remedy evidence, server/hints/remedy.py


def _key_pattern_as_property_names(schema: dict) -> None:
    # pydantic publishes a key pattern as patternProperties, which lets any other key through
    # unchecked; propertyNames is what refuses them, as the collector does.
    ((pattern, values),) = schema.pop("patternProperties").items()
    schema["propertyNames"]["pattern"] = pattern
    schema["additionalProperties"] = values


@_wire
class Batch(TypedDict):
    version: Literal[1]
    node: PathName
    cluster: NotRequired[PathName]  # default "default"
    labels: NotRequired[Annotated[dict[Annotated[str, Field(min_length=1, max_length=63, pattern=PRINTABLE)],
                                       Annotated[str, Field(max_length=253, pattern=PRINTABLE)]],
                                  Field(max_length=MAX_LABELS, json_schema_extra=_key_pattern_as_property_names)]]
    agent: NotRequired[AgentInfo | None]
    samples: Annotated[list[SampleIn], Field(max_length=MAX_SAMPLES)]


BATCH = TypeAdapter(Batch)
DEFAULT_CLUSTER = "default"

WORKLOAD_FIELDS: tuple[str, ...] = tuple(Workload.__annotations__)
# The readings, in table order: also the sample tables' columns after (id, ts) (server/store/schema.py).
GPU_METRICS: tuple[str, ...] = GPU_READING_NAMES
NIC_METRICS: tuple[str, ...] = NIC_READING_NAMES
