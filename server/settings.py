"""The collector's one settings class, one section per component. Built explicitly and passed to
create_app(settings).

Each component reads its own section, set through the environment as LAGGARD_<SECTION>__<NAME>
(docs/configuration.md): `auth`, `ingest`, `ingest_limits`, `writer`, `retention`,
`detector`, `detection`, `hints`, `metrics`, `alerts`; what the whole process shares (database,
address, workers, TLS, the interpreter) stays at the top. The flat names of earlier versions
(LAGGARD_INSECURE, LAGGARD_TOKEN_CACHE_S, LAGGARD_RAW_RETENTION_HOURS, ...; Settings(insecure=True))
still work: LEGACY_NAMES puts each into its section."""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

from server.alerts.settings import AlertSettings
from server.auth.settings import AuthSettings
from server.detect.settings import DetectionSettings
from server.hints.settings import HintSettings
from server.ingest.settings import IngestLimits, IngestSettings, WriterSettings
from server.metrics.settings import MetricsSettings
from server.store.engine import SQLITE_MMAP_MB


class RetentionSettings(BaseModel):
    """How long stored data is kept, and how often it is pruned and rolled up (LAGGARD_RETENTION__<NAME>;
    server/store/retention.py, server/store/rollups.py, docs/operations.md#retention-and-rollups)."""

    raw_hours: float = Field(48.0, gt=0, description="Raw samples (and the ingest log) older than this, by sample time, are deleted; "
                                                     "their per-minute rollups stay.")
    rollup_days: float = Field(30.0, gt=0, description="Per-minute rollups and workload changes older than this are deleted.")
    event_days: float = Field(365.0, gt=0, description="Resolved episodes, their events and XID events older than this are deleted.")
    days: float | None = Field(
        None, gt=0, description="Deprecated (one horizon for everything before rollups; LAGGARD_RETENTION_DAYS): if set, raw "
                                "samples are kept this many days.",
    )
    interval_s: float = Field(600.0, description="How often retention runs.")
    rollup_interval_s: float = Field(60.0, gt=0, description="How often closed minutes are rolled up (server/store/rollups.py).")

    @property
    def raw_s(self) -> float:
        """How long raw samples stay: the deprecated single horizon where set, else raw_hours."""
        return self.days * 86400 if self.days is not None else self.raw_hours * 3600


class DetectorSettings(BaseModel):
    """Where and how often the detector runs (LAGGARD_DETECTOR__<NAME>; server/detect/service.py). What it
    judges by is the `detection` section (LAGGARD_DETECTION__<NAME>, server/detect/settings.py)."""

    enabled: bool = Field(True, description="Run the detector in this process (one process per database leads).")
    poll_s: float = Field(0.2, description="How often the detector looks for newly committed samples.")
    leader_retry_s: float = Field(
        2.0, description="How often a replica that does not lead detection tries to take the lead (takeover delay after the leader dies).",
    )


# The flat names of earlier versions (LAGGARD_<NAME> and Settings(<name>=...)) -> (section, name
# there). Still accepted everywhere; docs/configuration.md lists them.
LEGACY_NAMES: dict[str, tuple[str, str]] = {
    "insecure": ("auth", "insecure"),
    "metrics_public": ("auth", "metrics_public"),
    "scheduler_public": ("auth", "scheduler_public"),
    "token_cache_s": ("auth", "token_cache_s"),
    "rate_limit_per_s": ("auth", "rate_limit_per_s"),
    "rate_limit_burst": ("auth", "rate_limit_burst"),
    "max_body_bytes": ("ingest", "max_body_bytes"),
    "max_future_skew_s": ("ingest", "max_future_skew_s"),
    "body_timeout_s": ("ingest", "body_timeout_s"),
    "gpu_move_after_s": ("ingest", "gpu_move_after_s"),
    "ingest_writer_threads": ("writer", "threads"),
    "ingest_group_max_bodies": ("writer", "group_max_bodies"),
    "ingest_slice_rows": ("writer", "slice_rows"),
    "ingest_small_rows": ("writer", "small_rows"),
    "ingest_heavy_wait_s": ("writer", "heavy_wait_s"),
    "write_failure_unready_s": ("writer", "failure_unready_s"),
    "ingest_writer_socket": ("writer", "socket"),
    "ingest_writer_key": ("writer", "key"),
    "raw_retention_hours": ("retention", "raw_hours"),
    "rollup_retention_days": ("retention", "rollup_days"),
    "event_retention_days": ("retention", "event_days"),
    "retention_days": ("retention", "days"),
    "retention_interval_s": ("retention", "interval_s"),
    "rollup_interval_s": ("retention", "rollup_interval_s"),
    "detection_enabled": ("detector", "enabled"),
    "detection_poll_s": ("detector", "poll_s"),
    "leader_retry_s": ("detector", "leader_retry_s"),
    "webhook_urls": ("alerts", "webhook_urls"),
    "webhook_secret": ("alerts", "webhook_secret"),
}


def _section_dict(value: Any) -> dict[str, Any]:
    """A section as given (a dict, a model, JSON text or nothing) as a dict of what it sets."""
    if value is None:
        return {}
    if isinstance(value, BaseModel):
        return {name: getattr(value, name) for name in value.model_fields_set}
    if isinstance(value, str | bytes):
        value = json.loads(value)  # a JSONDecodeError is a ValueError: pydantic reports it
    if not isinstance(value, Mapping):
        raise ValueError(f"a settings section is a mapping, not {type(value).__name__}")
    return dict(value)


def nest_legacy_names(data: Mapping[str, Any]) -> dict[str, Any]:
    """`data` with each legacy flat name (LEGACY_NAMES, any case) moved into its section. A flat
    name given beside the same setting in its section wins: among keyword arguments both are the
    caller's, and it is the more specific; between LAGGARD_* variables the sources decide
    (Settings.settings_customise_sources: the nested name wins there)."""
    moved: dict[str, dict[str, Any]] = {}
    out: dict[str, Any] = {}
    for key, value in data.items():
        target = LEGACY_NAMES.get(key.lower()) if isinstance(key, str) else None
        if target is None:
            out[key] = value
        else:
            moved.setdefault(target[0], {})[target[1]] = value
    for section, values in moved.items():
        out[section] = {**_section_dict(out.get(section)), **values}
    return out


class _LegacyEnvNames(PydanticBaseSettingsSource):
    """The legacy flat LAGGARD_<NAME> variables that `env` (the environment, or a dotenv file) holds,
    in their sections. Ranked just below `env`, so that LAGGARD_AUTH__TOKEN_CACHE_S wins over
    LAGGARD_TOKEN_CACHE_S where both are set."""

    def __init__(self, settings_cls: type[BaseSettings], env: EnvSettingsSource):
        super().__init__(settings_cls)
        self.env = env
        self.__name__ = f"LegacyNames({type(env).__name__})"

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, "", False  # the whole work is in __call__

    def __call__(self) -> dict[str, Any]:
        found = {}
        for name in LEGACY_NAMES:
            env_name = f"{self.env.env_prefix}{name}"
            value = self.env.env_vars.get(env_name if self.env.case_sensitive else env_name.lower())
            if value is not None:
                found[name] = value
        return nest_legacy_names(found)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LAGGARD_", env_nested_delimiter="__", extra="ignore")

    # --- the process ---------------------------------------------------------------------
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
    tls_cert_file: str | None = Field(None, description="Serve HTTPS with this certificate chain (PEM); needs tls_key_file.")
    tls_key_file: str | None = Field(None, description="The private key (PEM) of tls_cert_file.")

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

    # --- one section per component (LAGGARD_<SECTION>__<NAME>) --------------------------------
    auth: AuthSettings = Field(default_factory=AuthSettings, description="Authentication and the per-token rate limit (server/auth, "
                                                                         "docs/security.md).")
    ingest: IngestSettings = Field(default_factory=IngestSettings, description="What a push may be: body size and time, clock skew, "
                                                                               "GPU moves.")
    ingest_limits: IngestLimits = Field(
        default_factory=IngestLimits, description="Limits by work (GPU-samples, in-flight requests, new nodes) per token and cluster.",
    )
    writer: WriterSettings = Field(default_factory=WriterSettings, description="How pushes are committed (server/store/writer.py).")
    retention: RetentionSettings = Field(default_factory=RetentionSettings, description="Retention and rollups (docs/operations.md).")
    detector: DetectorSettings = Field(default_factory=DetectorSettings, description="Where and how often the detector runs.")
    detection: DetectionSettings = Field(default_factory=DetectionSettings, description="What the detector judges by (docs/detection.md).")
    hints: HintSettings = Field(default_factory=HintSettings, description="Scheduler hints (server/hints, docs/rebalancing.md).")
    # Prometheus exposition and alert webhooks (issue #5; docs/observability.md).
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    alerts: AlertSettings = Field(default_factory=AlertSettings)

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource) -> tuple[PydanticBaseSettingsSource, ...]:
        # pydantic-settings' order (keyword arguments, environment, dotenv, secrets), each
        # environment source followed by the legacy flat names it holds. Keyword arguments with
        # legacy names are nested by _nest_legacy_names below.
        sources: list[PydanticBaseSettingsSource] = [init_settings]
        for source in (env_settings, dotenv_settings):
            sources.append(source)
            if isinstance(source, EnvSettingsSource):
                sources.append(_LegacyEnvNames(settings_cls, source))
        return (*sources, file_secret_settings)

    @model_validator(mode="before")
    @classmethod
    def _nest_legacy_names(cls, data: Any) -> Any:
        return nest_legacy_names(data) if isinstance(data, Mapping) else data

    @field_validator("database_url")
    @classmethod
    def _use_psycopg3(cls, url: str) -> str:
        # A plain postgresql:// URL would make SQLAlchemy look for psycopg2, which we don't ship.
        for prefix in ("postgresql://", "postgres://"):
            if url.startswith(prefix):
                return "postgresql+psycopg://" + url[len(prefix):]
        return url

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    def with_changes(self, changes: Mapping[str, Any]) -> Settings:
        """A copy with `changes` (top-level names, section names with a dict of the section's names
        to change, or legacy flat names), unvalidated as model_copy(update=...) is."""
        update: dict[str, Any] = {}
        for name, value in nest_legacy_names(changes).items():
            current = getattr(self, name, None)
            update[name] = current.model_copy(update=value) if isinstance(current, BaseModel) and isinstance(value, Mapping) else value
        return self.model_copy(update=update)


# `laggard` flags that name a setting (server/cli/main.py).
# (`insecure` is the legacy name of auth.insecure, nested by the Settings like any keyword argument.)
FLAG_SETTINGS = ("database_url", "host", "port", "workers", "tls_cert_file", "tls_key_file", "insecure")


def settings_from_flags(flags: object) -> Settings:
    """Settings with the command line's flags (an argparse namespace) over LAGGARD_* variables,
    which win over defaults."""
    overrides = {k: v for k in FLAG_SETTINGS if (v := getattr(flags, k, None)) is not None}
    return Settings(**overrides)


def replica_name(settings: Settings) -> str:
    return settings.replica or f"{socket.gethostname()}:{settings.port}"
