"""Wire protocol v1 (docs/protocol.md): what an agent may POST to /api/v1/samples.

Validation runs on the raw JSON bytes (pydantic-core), strict about types, so "5" is not a
temperature and NaN/Infinity are refused. Unknown fields are ignored so that newer agents can
talk to older collectors. The shapes are TypedDicts rather than models: ingest validates
every field of every GPU of every sample, and building plain dicts is about twice as fast as
building model instances (measured in docs/performance.md). Optional keys may be absent;
readers use .get() and the defaults named here.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, TypeAdapter, with_config
from typing_extensions import NotRequired, TypedDict

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
# Counters are stored as signed 64-bit integers (PostgreSQL BIGINT).
Count = Annotated[int, Field(ge=0, le=2**63 - 1)]
NonNeg = Annotated[float, Field(ge=0)]
Pct = Annotated[float, Field(ge=0, le=100)]
Celsius = Annotated[float, Field(ge=-50, le=200)]
Short = Annotated[str, Field(max_length=64, pattern=PRINTABLE)]
# Physical ranges, generous enough for any GPU or NIC made or announced, tight enough that a
# unit mix-up (kHz for MHz, mW for W) or garbage is refused instead of skewing the peer medians.
MHz = Annotated[int, Field(ge=0, le=100_000)]
Watts = Annotated[float, Field(ge=0, le=10_000)]
Bytes = Annotated[int, Field(ge=0, le=2**50)]  # 1 PiB of GPU memory
BytesPerS = Annotated[float, Field(ge=0, le=1e13)]
PcieGen = Annotated[int, Field(ge=0, le=16)]
Lanes = Annotated[int, Field(ge=0, le=64)]
Links = Annotated[int, Field(ge=0, le=64)]
Gbps = Annotated[float, Field(ge=0, le=100_000)]

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


@_wire
class Gpu(TypedDict):
    index: Annotated[int, Field(ge=0, le=1023)]
    uuid: Name
    model: NotRequired[Annotated[str, Field(max_length=128, pattern=PRINTABLE)] | None]
    pci_bus_id: NotRequired[Short | None]
    lost: NotRequired[bool]  # default false
    temp_c: NotRequired[Celsius | None]
    mem_temp_c: NotRequired[Celsius | None]
    power_w: NotRequired[Watts | None]
    power_limit_w: NotRequired[Watts | None]
    sm_clock_mhz: NotRequired[MHz | None]
    sm_clock_max_mhz: NotRequired[MHz | None]
    mem_clock_mhz: NotRequired[MHz | None]
    mem_clock_max_mhz: NotRequired[MHz | None]
    util_gpu_pct: NotRequired[Pct | None]
    util_mem_pct: NotRequired[Pct | None]
    mem_used_bytes: NotRequired[Bytes | None]
    mem_total_bytes: NotRequired[Bytes | None]
    clocks_event_reasons: NotRequired[Count | None]
    pcie_gen: NotRequired[PcieGen | None]
    pcie_gen_max: NotRequired[PcieGen | None]
    pcie_width: NotRequired[Lanes | None]
    pcie_width_max: NotRequired[Lanes | None]
    pcie_replay_total: NotRequired[Count | None]
    pcie_tx_bytes_per_s: NotRequired[BytesPerS | None]
    pcie_rx_bytes_per_s: NotRequired[BytesPerS | None]
    nvlink_links_up: NotRequired[Links | None]
    nvlink_links_total: NotRequired[Links | None]
    nvlink_tx_bytes_total: NotRequired[Count | None]
    nvlink_rx_bytes_total: NotRequired[Count | None]
    nvlink_crc_errors_total: NotRequired[Count | None]
    nvlink_replay_errors_total: NotRequired[Count | None]
    nvlink_recovery_errors_total: NotRequired[Count | None]
    ecc_corrected_total: NotRequired[Count | None]
    ecc_uncorrected_total: NotRequired[Count | None]
    remapped_rows_pending: NotRequired[bool | None]
    tensor_active_pct: NotRequired[Pct | None]  # GPM, Hopper+; absent from older agents
    # dcgm-exporter's default series (issue #16); absent from older agents. New keys go last:
    # gpu_samples has one column per key, in this order (server/store/samples.py).
    energy_mj_total: NotRequired[Count | None]
    util_enc_pct: NotRequired[Pct | None]
    util_dec_pct: NotRequired[Pct | None]
    mem_reserved_bytes: NotRequired[Bytes | None]
    remapped_rows_correctable_total: NotRequired[Count | None]
    remapped_rows_uncorrectable_total: NotRequired[Count | None]
    remapped_rows_failure: NotRequired[bool | None]
    gr_engine_active_pct: NotRequired[Pct | None]  # GPM, Hopper+
    dram_active_pct: NotRequired[Pct | None]  # GPM, Hopper+
    # Not a reading: stored as changes in gpu_workloads, not as a gpu_samples column. Absent
    # (older agents): nothing stored; null: unknown.
    workload: NotRequired[Workload | None]
    xids: NotRequired[Annotated[list[Xid], Field(max_length=MAX_XIDS)]]  # default []


@_wire
class Nic(TypedDict):
    device: Name
    port: Annotated[int, Field(ge=0, le=255)]
    state: NotRequired[Annotated[str, Field(max_length=32, pattern=PRINTABLE)] | None]
    rate_gbps: NotRequired[Gbps | None]
    tx_bytes_total: NotRequired[Count | None]
    rx_bytes_total: NotRequired[Count | None]
    symbol_errors_total: NotRequired[Count | None]
    link_downed_total: NotRequired[Count | None]
    rcv_errors_total: NotRequired[Count | None]
    xmit_discards_total: NotRequired[Count | None]
    xmit_wait_total: NotRequired[Count | None]


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

_IDENTITY = {"index", "uuid", "model", "pci_bus_id", "workload", "xids"}
WORKLOAD_FIELDS: tuple[str, ...] = tuple(Workload.__annotations__)
GPU_METRICS: tuple[str, ...] = tuple(k for k in Gpu.__annotations__ if k not in _IDENTITY)
NIC_METRICS: tuple[str, ...] = tuple(k for k in Nic.__annotations__ if k not in {"device", "port"})
