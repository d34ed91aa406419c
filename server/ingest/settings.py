"""Settings of ingest: the work-based limits (LAGGARD_INGEST_LIMITS__<NAME>; server/ingest/admission.py), what a push
may be (LAGGARD_INGEST__<NAME>) and how pushes are committed (LAGGARD_WRITER__<NAME>)."""

from __future__ import annotations

from pydantic import BaseModel, Field, SecretStr


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


MIB = 1024 * 1024


class IngestSettings(BaseModel):
    """What a push may be (LAGGARD_INGEST__<NAME>; server/ingest/router.py, server/ingest/body_deadline.py)."""

    max_body_bytes: int = Field(16 * MIB, description="Request body limit, counted after gzip decompression too.")
    max_future_skew_s: float = Field(300.0, description="Samples stamped further than this in the future are rejected.")
    body_timeout_s: float = Field(
        30.0, gt=0, description="A request body must arrive whole within this many seconds of the request's headers (408 and the "
                                "connection closed beyond), so that a client sending less than its Content-Length cannot hold a "
                                "connection. 16 MiB in 30 s needs 0.6 MB/s.",
    )
    gpu_move_after_s: float = Field(
        300.0, gt=0, description="A GPU (by UUID) moves to another node only once its node has not reported it for this long; "
                                 "until then a second node reporting it gets 409 (server/store/ids.py).",
    )


class WriterSettings(BaseModel):
    """How pushes are committed (LAGGARD_WRITER__<NAME>; server/store/writer.py, server/store/writer_service.py)."""

    threads: int = Field(0, description="Writer threads; 0 = automatic: 1 for SQLite (one writer), 4 otherwise.")
    group_max_bodies: int = Field(64, description="Most request bodies committed in one transaction.")
    slice_rows: int = Field(
        128, description="A heavy push (see small_rows) is committed in slices of about this many rows, each its own "
                         "transaction, between other tokens' pushes.",
    )
    small_rows: int = Field(
        1024, ge=0, description="A push of more rows (a new node, GPU or port counting as 32) is heavy: committed in slices of "
                                "slice_rows, each alone and only when no lighter push of another token waits. Lighter "
                                "pushes are committed together. 0: no push is heavy, every token served in turn regardless of size.",
    )
    heavy_wait_s: float = Field(
        0.05, description="Heavy pushes passed over this long while smaller ones were served: the next transaction is a heavy one "
                          "(so that small pushes cannot starve them).",
    )
    failure_unready_s: float = Field(
        30.0, description="After a push fails for the database's reason (disk full, database unreachable), /readyz answers 503 "
                          "until a push succeeds, for at most this long: a collector taken out of its Service sees no pushes, "
                          "so it then reports ready again to try.",
    )
    # Set by `laggard server --workers N` on SQLite for its workers (server/store/writer_service.py).
    socket: str | None = Field(None, description="Unix socket of the shared writer process; none: write in-process.")
    key: SecretStr | None = Field(None, description="Hex key that authenticates workers to the writer process.")

    def threads_for(self, is_sqlite: bool) -> int:
        """The writer threads to run: `threads`, or by the database when 0."""
        if self.threads > 0:
            return self.threads
        return 1 if is_sqlite else 4
