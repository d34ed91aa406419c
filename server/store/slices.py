"""A batch's cost in rows, and a large batch cut into slices that the writer commits one by
one, between other agents' batches (issue #12): the largest batch the protocol allows (1,000
samples x 64 GPUs) took the writer 1.5-3.3 s in one piece, and every other push waited behind
it. Each slice is its own transaction; the request is answered once every slice is
committed. Should the collector stop half-way, the agent, unanswered, sends the batch again, and
the rows already stored are ignored as duplicates (keyed by GPU or port and ts)."""

from __future__ import annotations

from collections import Counter

from server.protocol import GPU_METRICS, NIC_METRICS
from server.store.samples import UnresolvedBatch

# Rows lie end to end in UnresolvedBatch: position in gpus (nics), ts, then the readings.
GPU_WIDTH = 2 + len(GPU_METRICS)
NIC_WIDTH = 2 + len(NIC_METRICS)


def row_count(batch: UnresolvedBatch) -> int:
    """GPU and port rows: what storing the batch costs."""
    return len(batch.gpu_rows) // GPU_WIDTH + len(batch.nic_rows) // NIC_WIDTH


def split(batch: UnresolvedBatch, max_rows: int) -> list[UnresolvedBatch]:
    """The batch as slices of about `max_rows` rows each, cut between sample instants (the
    detector reads a node's instants whole); itself if it is small. The slices' sample counts
    add up to the batch's (each slice is logged for the detector and the metrics as a batch of
    its own); XIDs go with the first slice, workload changes with their instant's slice."""
    if row_count(batch) <= max_rows or max_rows <= 0:
        return [batch]
    gpu_ts, nic_ts = batch.gpu_rows[1::GPU_WIDTH], batch.nic_rows[1::NIC_WIDTH]
    part_of = _parts_by_instant(gpu_ts + nic_ts, max_rows)
    if len(set(part_of.values())) <= 1:
        return [batch]
    n = max(part_of.values()) + 1
    gpu_rows, nic_rows = _deal(batch.gpu_rows, gpu_ts, GPU_WIDTH, part_of, n), _deal(batch.nic_rows, nic_ts, NIC_WIDTH, part_of, n)
    instants = [0] * n
    for part in part_of.values():
        instants[part] += 1
    instants[-1] += batch.samples - len(part_of)  # samples sharing an instant: the counts still add up
    workload_rows: list[list[tuple]] = [[] for _ in range(n)]
    for row in batch.workload_rows:  # (position, ts, ...): ts is one of the GPU rows' instants
        workload_rows[part_of.get(row[1], 0)].append(row)
    slices = []
    for i in range(n):
        stamps = gpu_rows[i][1::GPU_WIDTH] + nic_rows[i][1::NIC_WIDTH]
        slices.append(batch._replace(samples=instants[i], min_ts=min(stamps), max_ts=max(stamps), gpu_rows=gpu_rows[i],
                                     nic_rows=nic_rows[i], xid_rows=batch.xid_rows if i == 0 else [],
                                     workload_rows=workload_rows[i]))
    return slices


def _parts_by_instant(stamps: list[float], max_rows: int) -> dict[float, int]:
    """Each instant's slice: instants in order of first appearance, a new slice once the
    current one holds `max_rows` rows."""
    rows = Counter(stamps)
    part_of, part, filled = {}, 0, 0
    for ts in dict.fromkeys(stamps):
        if filled and filled + rows[ts] > max_rows:
            part, filled = part + 1, 0
        part_of[ts] = part
        filled += rows[ts]
    return part_of


def _deal(flat: list, stamps: list[float], width: int, part_of: dict[float, int], parts: int) -> list[list]:
    """Rows laid end to end, dealt to their instants' slices (runs of one slice copied at once)."""
    out: list[list] = [[] for _ in range(parts)]
    start = 0
    for i in range(1, len(stamps) + 1):
        if i == len(stamps) or part_of[stamps[i]] != part_of[stamps[start]]:
            out[part_of[stamps[start]]] += flat[start * width:i * width]
            start = i
    return out
