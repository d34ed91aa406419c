"""The collector's one settings class. Built explicitly and passed to create_app(settings)."""

from __future__ import annotations

import socket

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from server.alerts.settings import AlertSettings
from server.detect.settings import DetectionSettings
from server.hints.settings import HintSettings
from server.ingest.settings import IngestLimits
from server.metrics.settings import MetricsSettings
from server.store.engine import SQLITE_MMAP_MB

MIB = 1024 * 1024


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LAGGARD_", env_nested_delimiter="__", extra="ignore")

    database_url: str = Field(
        "sqlite:///laggard.db",
        description="SQLAlchemy URL; postgresql://... uses psycopg 3. Default: SQLite file in the working directory.",
    )
    host: str = "127.0.0.1"
    port: int = 8080
    workers: int = Field(1, description="uvicorn worker processes; ingest parses in parallel across them.")
    replica: str | None = Field(
        None, max_length=200, description="This collector's name among replicas sharing a database (default: host:port). The "
                                          "replica leading detection exports the fleet-level metrics; the others do not.")
    migrate_on_start: bool = True

    max_body_bytes: int = Field(16 * MIB, description="Request body limit, counted after gzip decompression too.")
    max_future_skew_s: float = Field(300.0, description="Samples stamped further than this in the future are rejected.")
    gpu_move_after_s: float = Field(
        300.0, gt=0, description="A GPU (by UUID) moves to another node only once its node has not reported it for this long; "
                                 "until then a second node reporting it gets 409 (server/store/ids.py).")
    body_timeout_s: float = Field(
        30.0, gt=0, description="A request body must arrive whole within this many seconds of the request's headers (408 and the "
                                "connection closed beyond), so that a client sending less than its Content-Length cannot hold a "
                                "connection. 16 MiB in 30 s needs 0.6 MB/s.",
    )

    gil_switch_interval_s: float = Field(
        0.0005, ge=0, description="CPython's GIL switch interval in the collector (sys.setswitchinterval; 0: Python's 5 ms). "
                                  "Shorter lets a small push through sooner while a large batch or the detector is busy "
                                  "(server/interpreter.py).",
    )
    memory_trim_interval_s: float = Field(
        5.0, description="How often the collector hands freed heap memory back to the system (glibc malloc_trim; 0: never).",
    )

    sqlite_mmap_mb: int = Field(
        SQLITE_MMAP_MB, ge=0, description="How much of the SQLite database file is read through a memory map (PRAGMA mmap_size; 0: none). "
                                          "Mapped pages count in the collector's RSS once read.",
    )

    raw_retention_hours: float = Field(48.0, gt=0, description="Raw samples (and the ingest log) older than this, by sample time, are deleted; "
                                                              "their per-minute rollups stay.")
    rollup_retention_days: float = Field(30.0, gt=0, description="Per-minute rollups and workload changes older than this are deleted.")
    event_retention_days: float = Field(365.0, gt=0, description="Resolved episodes, their events and XID events older than this are deleted.")
    retention_days: float | None = Field(
        None, gt=0, description="Deprecated (one horizon for everything before rollups): if set, raw samples are kept this many days.",
    )
    retention_interval_s: float = Field(600.0, description="How often retention runs.")
    rollup_interval_s: float = Field(60.0, gt=0, description="How often closed minutes are rolled up (server/store/rollups.py).")

    detection: DetectionSettings = Field(default_factory=DetectionSettings)
    detection_enabled: bool = Field(True, description="Run the detector in this process (one process per database leads).")
    detection_poll_s: float = Field(0.2, description="How often the detector looks for newly committed samples.")
    leader_retry_s: float = Field(
        2.0, description="How often a replica that does not lead detection tries to take the lead (takeover delay after the leader dies).",
    )
    hints: HintSettings = Field(default_factory=HintSettings, description="Scheduler hints (server/hints, docs/rebalancing.md).")

    write_failure_unready_s: float = Field(
        30.0, description="After a push fails for the database's reason (disk full, database unreachable), /readyz answers 503 "
                          "until a push succeeds, for at most this long: a collector taken out of its Service sees no pushes, "
                          "so it then reports ready again to try.",
    )
    ingest_writer_threads: int = Field(0, description="0 = automatic: 1 for SQLite (one writer), 4 otherwise.")
    ingest_group_max_bodies: int = Field(64, description="Most request bodies committed in one transaction.")
    ingest_slice_rows: int = Field(
        128, description="A heavy push (see ingest_small_rows) is committed in slices of about this many rows, each its own "
                          "transaction, between other tokens' pushes.",
    )
    ingest_small_rows: int = Field(
        1024, ge=0, description="A push of more rows (a new node, GPU or port counting as 32) is heavy: committed in slices of "
                                "ingest_slice_rows, each alone and only when no lighter push of another token waits. Lighter "
                                "pushes are committed together. 0: no push is heavy, every token served in turn regardless of size.",
    )
    ingest_heavy_wait_s: float = Field(
        0.05, description="Heavy pushes passed over this long while smaller ones were served: the next transaction is a heavy one "
                         "(so that small pushes cannot starve them).",
    )
    # Set by `laggard server --workers N` on SQLite for its workers (server/store/writer_service.py).
    ingest_writer_socket: str | None = Field(None, description="Unix socket of the shared writer process; none: write in-process.")
    ingest_writer_key: SecretStr | None = Field(None, description="Hex key that authenticates workers to the writer process.")

    # Authentication (server/auth, docs/security.md).
    insecure: bool = Field(False, description="Turn authentication off (LAGGARD_INSECURE=1): anyone may push, read and drain. Demo and tests only.")
    metrics_public: bool = Field(False, description="Serve GET /metrics without a token (else: a token with the read scope).")
    scheduler_public: bool = Field(
        False, description="Serve the kube-scheduler extender (/scheduler/*) without a token: kube-scheduler cannot send one; "
                           "restrict who reaches it (NetworkPolicy) instead.",
    )
    token_cache_s: float = Field(10.0, description="How long a worker trusts a looked-up token (a revoked one works at most this long).")
    rate_limit_per_s: float = Field(
        200.0, description="Requests per second per token, per process, on average (429 beyond). One agent token shared by a "
                           "cluster sends about nodes / push interval: 1,000 nodes every 5 s is 200/s.",
    )
    rate_limit_burst: float = Field(400.0, description="Requests a token may send at once before the rate limit applies.")
    ingest_limits: IngestLimits = Field(
        default_factory=IngestLimits, description="Limits by work (GPU-samples, in-flight requests, new nodes) per token and cluster.",
    )
    tls_cert_file: str | None = Field(None, description="Serve HTTPS with this certificate chain (PEM); needs tls_key_file.")
    tls_key_file: str | None = Field(None, description="The private key (PEM) of tls_cert_file.")

    # Prometheus exposition and alert webhooks (issue #5; docs/observability.md).
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    alerts: AlertSettings = Field(default_factory=AlertSettings)
    webhook_urls: str = Field("", description="Comma-separated webhook URLs that receive every alert (Alertmanager v4 payload).")
    webhook_secret: SecretStr | None = Field(None, description="HMAC-SHA256 key for the X-Laggard-Signature header.")

    @field_validator("database_url")
    @classmethod
    def _use_psycopg3(cls, url: str) -> str:
        # A plain postgresql:// URL would make SQLAlchemy look for psycopg2, which we don't ship.
        for prefix in ("postgresql://", "postgres://"):
            if url.startswith(prefix):
                return "postgresql+psycopg://" + url[len(prefix):]
        return url

    @property
    def raw_retention_s(self) -> float:
        # The deprecated single horizon, where set, is how long raw samples stay.
        return self.retention_days * 86400 if self.retention_days is not None else self.raw_retention_hours * 3600

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    @property
    def writer_threads(self) -> int:
        if self.ingest_writer_threads > 0:
            return self.ingest_writer_threads
        return 1 if self.is_sqlite else 4


# `laggard` flags that name a setting (server/cli/main.py).
FLAG_SETTINGS = ("database_url", "host", "port", "workers", "tls_cert_file", "tls_key_file", "insecure")


def settings_from_flags(flags: object) -> Settings:
    """Settings with the command line's flags (an argparse namespace) over LAGGARD_* variables,
    which win over defaults."""
    overrides = {k: v for k in FLAG_SETTINGS if (v := getattr(flags, k, None)) is not None}
    return Settings(**overrides)


def replica_name(settings: Settings) -> str:
    return settings.replica or f"{socket.gethostname()}:{settings.port}"
