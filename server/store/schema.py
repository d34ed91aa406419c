"""SQLAlchemy 2 models. Time series tables hold one row per GPU (or NIC) per sample, metrics as
columns, keyed by (id, ts) so a re-sent sample is stored once. `ts` is the sample's own time
(epoch seconds), never the time it arrived."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, REAL, BigInteger, Boolean, Column, Float, ForeignKey, Index, Integer, String, Table, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from agent.fields import GPU_READINGS, NIC_READINGS, Reading


class Base(DeclarativeBase):
    pass


class Node(Base):
    __tablename__ = "nodes"
    __table_args__ = (UniqueConstraint("cluster", "name", name="uq_nodes_cluster_name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cluster: Mapped[str] = mapped_column(String(253))
    name: Mapped[str] = mapped_column(String(253))
    labels: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    agent: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    first_seen: Mapped[float] = mapped_column(Float)
    last_seen: Mapped[float] = mapped_column(Float)


class Gpu(Base):
    __tablename__ = "gpus"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uuid: Mapped[str] = mapped_column(String(253), unique=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id"), index=True)
    index: Mapped[int] = mapped_column(Integer)
    model: Mapped[str | None] = mapped_column(String(128), nullable=True)
    pci_bus_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    first_seen: Mapped[float] = mapped_column(Float)


class Nic(Base):
    __tablename__ = "nics"
    __table_args__ = (UniqueConstraint("node_id", "device", "port", name="uq_nics_node_device_port"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id"))
    device: Mapped[str] = mapped_column(String(253))
    port: Mapped[int] = mapped_column(Integer)
    first_seen: Mapped[float] = mapped_column(Float)


def _column_type(reading: Reading) -> Any:
    """A reading's column type: the smallest that holds its physical range (agent/fields.py)."""
    if reading.type is bool:
        return Boolean
    if reading.type is str:
        return String(reading.max_length)
    if reading.type is float:
        return Float
    return Integer if reading.hi is not None and reading.hi <= 2**31 - 1 else BigInteger


def _sample_table(name: str, key: str, parent: str, readings: tuple[Reading, ...]) -> Table:
    """One row per entity per sample, keyed by (key, ts) so a re-sent sample is stored once; one
    column per reading, in the table's order (the wire's: server/store/samples.py relies on it).
    No index on ts alone: every reader (API, detector, retention) goes through the primary key,
    and each extra index costs a b-tree insert per row on the ingest hot path."""
    columns = [Column(key, Integer, ForeignKey(f"{parent}.id"), primary_key=True), Column("ts", Float, primary_key=True)]
    for reading in readings:
        default = {} if reading.nullable else {"nullable": False, "default": reading.default}
        columns.append(Column(reading.name, _column_type(reading), **default))
    return Table(name, Base.metadata, *columns)


class GpuSample(Base):
    __table__ = _sample_table("gpu_samples", "gpu_id", "gpus", GPU_READINGS)


class NicSample(Base):
    __table__ = _sample_table("nic_samples", "nic_id", "nics", NIC_READINGS)


# Per-minute rollups (issue #17): kept long after the raw samples are gone. Each gauge a
# dashboard plots as its min, mean and max over the minute (single precision: a plot needs no
# more); every other reading (counters, limits, link and flag states) as its last value.
GPU_ROLLUP_GAUGES = tuple(r.name for r in GPU_READINGS if r.plot)
ROLLUP_STATS = ("min", "mean", "max")


def _rollup_table(name: str, samples: Table, key: str, parent: str, gauges: tuple[str, ...]) -> Table:
    """`samples`' readings by (key, minute): `minute` is epoch seconds // 60, `samples` how many
    raw samples the minute had."""
    columns = [Column(key, Integer, ForeignKey(f"{parent}.id"), primary_key=True), Column("minute", Integer, primary_key=True),
               Column("samples", Integer, nullable=False)]
    for reading in samples.columns[2:]:
        if reading.name in gauges:
            columns += [Column(f"{reading.name}_{stat}", REAL) for stat in ROLLUP_STATS]
        else:
            columns.append(Column(reading.name, reading.type))
    return Table(name, Base.metadata, *columns)


GpuRollupT = _rollup_table("gpu_rollups", GpuSample.__table__, "gpu_id", "gpus", GPU_ROLLUP_GAUGES)
NicRollupT = _rollup_table("nic_rollups", NicSample.__table__, "nic_id", "nics", tuple(r.name for r in NIC_READINGS if r.plot))


class RollupProgress(Base):
    """How far each sample table is rolled up (server/store/rollups.py): every minute before
    `through_minute`, and the ingest log up to `log_id` looked at for late batches."""

    __tablename__ = "rollup_progress"

    samples_table: Mapped[str] = mapped_column(String(64), primary_key=True)
    through_minute: Mapped[int] = mapped_column(Integer)
    log_id: Mapped[int] = mapped_column(BigInteger)


class XidEvent(Base):
    """A one-off event (node-problem-detector's sense), not a condition."""

    __tablename__ = "xid_events"
    __table_args__ = (
        UniqueConstraint("gpu_id", "ts", "xid", name="uq_xid_events_gpu_ts_xid"),
        Index("ix_xid_events_ts", "ts"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    gpu_id: Mapped[int] = mapped_column(ForeignKey("gpus.id"))
    xid: Mapped[int] = mapped_column(Integer)
    ts: Mapped[float] = mapped_column(Float)


class GpuWorkload(Base):
    """What used a GPU from `ts` (the sample time it was first reported) until the GPU's next row:
    one row per change, not per sample (issue #15; server/store/workloads.py). kind NULL with
    every other column NULL: unknown (the agent could not tell); kind "idle": no process. Wire
    names (server/protocol.py Workload), but idle is spelled out."""

    __tablename__ = "gpu_workloads"

    gpu_id: Mapped[int] = mapped_column(ForeignKey("gpus.id"), primary_key=True)
    ts: Mapped[float] = mapped_column(Float, primary_key=True)
    kind: Mapped[str | None] = mapped_column(String(16))
    job: Mapped[str | None] = mapped_column(String(256))
    namespace: Mapped[str | None] = mapped_column(String(253))
    pod: Mapped[str | None] = mapped_column(String(253))
    pod_uid: Mapped[str | None] = mapped_column(String(64))
    container: Mapped[str | None] = mapped_column(String(253))
    container_id: Mapped[str | None] = mapped_column(String(64))
    slurm_job_id: Mapped[str | None] = mapped_column(String(64))
    slurm_step: Mapped[str | None] = mapped_column(String(64))
    user: Mapped[str | None] = mapped_column(String(256))
    process: Mapped[str | None] = mapped_column(String(253))
    pid: Mapped[int | None] = mapped_column(Integer)
    processes: Mapped[int | None] = mapped_column(Integer)
    workloads: Mapped[int | None] = mapped_column(Integer)


class IngestLog(Base):
    """One row per committed batch: which node's samples, over which sample-time range.
    The detector follows this log (by id) to find new data exactly once, whichever worker or
    replica stored it, including back-filled samples older than what it already judged."""

    __tablename__ = "ingest_log"
    # Ids are never reused, even after retention deletes the newest rows: the detector's
    # read position is an id.
    __table_args__ = {"sqlite_autoincrement": True}

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id"))
    min_ts: Mapped[float] = mapped_column(Float)
    max_ts: Mapped[float] = mapped_column(Float)
    samples: Mapped[int] = mapped_column(Integer)
    committed_at: Mapped[float] = mapped_column(Float)


class Episode(Base):
    """A straggler condition: opened when detected, resolved when it cleared (a condition,
    not an event: one fault is one episode)."""

    __tablename__ = "episodes"
    __table_args__ = (
        Index("ix_episodes_active", "resolved_at", "cluster"),
        Index("ix_episodes_onset", "onset"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cluster: Mapped[str] = mapped_column(String(253))
    node: Mapped[str] = mapped_column(String(253))
    gpu: Mapped[int | None] = mapped_column(Integer, nullable=True)
    uuid: Mapped[str | None] = mapped_column(String(253), nullable=True)
    entity: Mapped[str] = mapped_column(String(600))
    cause: Mapped[str] = mapped_column(String(32))
    severity: Mapped[str] = mapped_column(String(16))
    onset: Mapped[float] = mapped_column(Float)
    detected_at: Mapped[float] = mapped_column(Float)
    resolved_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    evidence: Mapped[dict[str, Any]] = mapped_column(JSON)
    summary: Mapped[str] = mapped_column(String(1000))


class DetectorProgress(Base):
    """How far the detector has read the ingest log and judged each cluster, so a restarted
    detector resumes where it stopped instead of judging samples twice."""

    __tablename__ = "detector_progress"

    key: Mapped[str] = mapped_column(String(300), primary_key=True)
    value: Mapped[float] = mapped_column(Float)


class EpisodeEvent(Base):
    """One change of an episode (opened, escalated, resolved), written by the detector in the
    transaction that changed the episode, with the episode as it then stood. The outputs read
    these (alerts turn them into alert_outbox rows); the detector imports none of them. `alerted`
    is the alerts' mark of what they have taken."""

    __tablename__ = "episode_events"
    __table_args__ = (
        Index("ix_episode_events_alerted", "alerted"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    # No foreign key: retention may delete the episode before its last event is taken.
    episode_id: Mapped[int] = mapped_column(Integer)
    change: Mapped[str] = mapped_column(String(16))
    at: Mapped[float] = mapped_column(Float)
    episode: Mapped[dict[str, Any]] = mapped_column(JSON)
    alerted: Mapped[bool] = mapped_column(Boolean, default=False)


# --- alerts and metrics (issue #5: server/alerts, server/metrics) ------------------------


class AlertOutbox(Base):
    """One alert state change (firing or resolved) of an episode, made from an episode event by
    the dispatcher in the transaction that takes the event. The dispatcher routes each row to
    its receivers (alert_deliveries) and delivers from there."""

    __tablename__ = "alert_outbox"
    __table_args__ = (
        Index("ix_alert_outbox_episode", "episode_id"),
        Index("ix_alert_outbox_routed", "routed"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    # No foreign key: retention may delete the episode while its resolve is still being delivered.
    episode_id: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[float] = mapped_column(Float)
    status: Mapped[str] = mapped_column(String(16))
    cluster: Mapped[str] = mapped_column(String(253))
    cause: Mapped[str] = mapped_column(String(32))
    fingerprint: Mapped[str] = mapped_column(String(32))
    alert: Mapped[dict[str, Any]] = mapped_column(JSON)
    routed: Mapped[bool] = mapped_column(Boolean, default=False)


class AlertDelivery(Base):
    """One outbox row for one receiver: pending until delivered (sent) or given up (dead)."""

    __tablename__ = "alert_deliveries"
    __table_args__ = (
        UniqueConstraint("outbox_id", "receiver", name="uq_alert_deliveries_outbox_receiver"),
        Index("ix_alert_deliveries_state", "state", "receiver", "group_key"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    outbox_id: Mapped[int] = mapped_column(ForeignKey("alert_outbox.id"))
    receiver: Mapped[str] = mapped_column(String(253))
    group_key: Mapped[str] = mapped_column(String(600))
    state: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[float] = mapped_column(Float)
    next_attempt_at: Mapped[float] = mapped_column(Float)
    lease_until: Mapped[float | None] = mapped_column(Float, nullable=True)
    lease_token: Mapped[str | None] = mapped_column(String(64), nullable=True)
    last_error: Mapped[str | None] = mapped_column(String(500), nullable=True)
    done_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class MetricCounter(Base):
    """Counters kept in the database, so every worker and replica exposes the same values
    (server/store/counters.py). `labels` is the label set as canonical JSON."""

    __tablename__ = "metric_counters"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    labels: Mapped[str] = mapped_column(String(1000), primary_key=True)
    value: Mapped[float] = mapped_column(Float)


class ApiToken(Base):
    """Bearer tokens (server/auth): only the SHA-256 of a token is kept; `key_id` is its
    public part. A revoked token stays, so `laggard token list` shows what was revoked when."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key_id: Mapped[str] = mapped_column(String(32), unique=True)
    token_hash: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(253), default="")
    scopes: Mapped[str] = mapped_column(String(100))  # comma-separated, sorted
    cluster: Mapped[str | None] = mapped_column(String(253), nullable=True)
    nodes: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class HintAck(Base):
    """An operator's acknowledgement that the remedy of a hardware fault happened on a node (gpu
    NULL) or one of its GPUs (server/hints/remedy.py): faults that began up to `sample_time`
    stop holding its hint. Kept, so the record shows who cleared what, and when."""

    __tablename__ = "hint_acks"
    __table_args__ = (Index("ix_hint_acks_node", "cluster", "node"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cluster: Mapped[str] = mapped_column(String(253))
    node: Mapped[str] = mapped_column(String(253))
    gpu: Mapped[int | None] = mapped_column(Integer, nullable=True)
    sample_time: Mapped[float] = mapped_column(Float)
    acked_at: Mapped[float] = mapped_column(Float)
    acked_by: Mapped[str] = mapped_column(String(253))
    key_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    note: Mapped[str] = mapped_column(String(1000), default="")
