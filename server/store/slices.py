"""A batch's cost in rows, and a large batch cut into slices that the writer commits one by
one, between other agents' batches (issue #12): the largest batch the protocol allows (1,000
samples x 64 GPUs) took the writer 1.5-3.3 s in one piece, and every other push waited behind
it. Each slice is its own transaction; the request is answered once every slice is
committed. Should the collector stop half-way, the agent, unanswered, sends the batch again, and
the rows already stored are ignored as duplicates (keyed by GPU or port and ts)."""

from __future__ import annotations

from server.protocol import GPU_METRICS, NIC_METRICS
from server.store.samples import UnresolvedBatch

# Rows lie end to end in UnresolvedBatch: position in gpus (nics), ts, then the readings.
GPU_WIDTH = 2 + len(GPU_METRICS)
NIC_WIDTH = 2 + len(NIC_METRICS)


def row_count(batch: UnresolvedBatch) -> int:
    """GPU and port rows: what storing the batch costs."""
    return len(batch.gpu_rows) // GPU_WIDTH + len(batch.nic_rows) // NIC_WIDTH


def split(batch: UnresolvedBatch, max_rows: int) -> list[UnresolvedBatch]:
    """The batch as slices of at most about `max_rows` rows each; itself if it is small. The
    slices' sample counts add up to the batch's (each slice is logged for the detector and the
    metrics as a batch of its own); XIDs go with the first slice."""
    rows = row_count(batch)
    # Every slice carries at least one sample: a slice of none would be skipped by the insert.
    parts = min(-(-rows // max_rows), batch.samples) if max_rows > 0 else 1
    if parts <= 1:
        return [batch]
    gpu_cuts = _cuts(len(batch.gpu_rows) // GPU_WIDTH, parts)
    nic_cuts = _cuts(len(batch.nic_rows) // NIC_WIDTH, parts)
    sample_cuts = _cuts(batch.samples, parts)
    slices = []
    for i in range(parts):
        gpu_rows = batch.gpu_rows[gpu_cuts[i] * GPU_WIDTH:gpu_cuts[i + 1] * GPU_WIDTH]
        nic_rows = batch.nic_rows[nic_cuts[i] * NIC_WIDTH:nic_cuts[i + 1] * NIC_WIDTH]
        stamps = gpu_rows[1::GPU_WIDTH] + nic_rows[1::NIC_WIDTH] or [batch.min_ts]
        slices.append(batch._replace(
            samples=sample_cuts[i + 1] - sample_cuts[i], min_ts=min(stamps), max_ts=max(stamps),
            gpu_rows=gpu_rows, nic_rows=nic_rows, xid_rows=batch.xid_rows if i == 0 else [],
        ))
    return slices


def _cuts(n: int, parts: int) -> list[int]:
    """Where `n` items are cut into `parts` nearly equal runs: parts + 1 positions, 0 to n."""
    return [n * i // parts for i in range(parts + 1)]
