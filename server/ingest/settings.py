"""Settings of the work-based ingest limits (LAGGARD_INGEST_LIMITS__<NAME>; server/ingest/admission.py)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class IngestLimits(BaseModel):
    enabled: bool = Field(True, description="Limit ingest by work per token and per cluster (429 with Retry-After beyond).")
    rows_per_s_per_token: float = Field(
        5_000.0, description="Rows stored (one GPU's or one port's reading at one instant) per second per token, on average. "
                              "A cluster of 1,000 nodes with 8 GPUs and 8 ports sharing one token, pushing every 5 s, sends 3,200/s.",
    )
    rows_burst_per_token: float = Field(
        130_000.0, description="Rows a token may send at once: one of the largest batches (1,000 samples x 64 GPUs and 64 ports) "
                               "and more; a batch is let in while the token's balance is positive and may leave it in debt.",
    )
    rows_per_s_per_cluster: float = Field(10_000.0, description="Rows per second per cluster, all its tokens together.")
    rows_burst_per_cluster: float = Field(260_000.0, description="Rows a cluster may send at once, all its tokens together.")
    max_concurrent_per_token: int = Field(
        32, description="Ingest requests of one token in flight at a time (each holds its body in memory until committed).",
    )
    node_registrations_per_min_per_token: float = Field(
        120.0, description="New node names a token may register per minute (a burst of as many at once). A new cluster of "
                          "1,000 nodes sharing one token is registered within about 8 minutes; its agents spool meanwhile.",
    )
    max_nodes_per_cluster: int = Field(20_000, description="Nodes a cluster may have; a push naming one more is refused with 409.")
