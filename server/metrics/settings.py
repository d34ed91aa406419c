"""Settings of the Prometheus exposition (LAGGARD_METRICS__<NAME>)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class MetricsSettings(BaseModel):
    enabled: bool = Field(True, description="Serve GET /metrics.")
    dcgm_series: bool = Field(
        True,
        description="Per-GPU series under dcgm-exporter's names and labels (DCGM_FI_DEV_*). Turn off where dcgm-exporter "
                    "already runs, so each reading is stored once (LAGGARD_METRICS__DCGM_SERIES=false).",
    )
    dcgm_extra_series: bool = Field(
        False,
        description="Also the DCGM series outside dcgm-exporter's default set that no dashboard uses (max SM clock, PCIe "
                    "throughput, NVLink replay/recovery errors, ECC totals, row remap pending): a fifth more per scrape.",
    )
    process_series: bool = Field(True, description="The serving process's own process_* and python_* series (per process).")
    max_sample_age_s: float = Field(
        300.0, description="A GPU or port whose latest sample is older than this (sample time) is left out: its node is gone."
    )
    node_stale_after_s: float = Field(60.0, description="A node whose latest sample is older than this counts as stale.")
    flush_interval_s: float = Field(
        5.0, description="How often each process adds its ingest request counts to the shared counters in the database."
    )
    gap_timeout_s: float = Field(
        30.0, description="Counting committed batches and XIDs: how long a hole in the ids (an uncommitted or rolled-back "
                          "transaction) is waited for before it is stepped over."
    )
