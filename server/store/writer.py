"""The ingest writer: request handlers hand it work and wait for the commit.

A job carries a `decode` callable (gunzip + validate + rows keyed by the batch's own GPUs and
NICs, server/store/samples.py unresolved_rows) that runs here, on the writer thread,
not on the event loop: the writer needs the GIL back after each SQLite statement, and a long
decode on another thread of the process makes it wait while it holds the write turn (decoding
in the handler measured ~13% slower with two workers, no faster with one).
Batches that arrive together are committed in one transaction (group commit); if a group
fails, each batch is retried on its own so one bad batch cannot sink its neighbours.

With several worker processes on SQLite only one can write at a time (write_lock.py). A
writer that finds the turn taken keeps decoding what arrives meanwhile, so that the wait
overlaps useful work and its next group commit is larger.

Fairness (issue #12): jobs wait in one lane per token, served in turn (fair_queue.py). A body of
more than `large_body_bytes` (decompressed) is decoded on a thread of its own, not on the
writer's (0.3 s for the largest), and joins its lane once decoded.

Small pushes first: a push of more than `small_rows` rows (1,024: many times an agent's usual
push) is heavy, and cut into slices of `slice_rows` (128, slices.py) that wait in its lane in
its place; a push that registers many new names is heavy too (a new node, GPU or port counts as
32 rows, _cost_in_rows). A heavy job is committed alone, and only when no light job of another
lane waits (within a lane the order is kept), unless heavy jobs have been passed over for
`heavy_wait_s` since the last one was committed: then one goes first, so that a steady stream
of small pushes cannot starve them. Light jobs are committed together, up to `group_rows` rows.
A small push thus waits for at most the one heavy slice being written when it arrives, never
for a slice of every heavy lane in turn. `small_rows` 0: no job is heavy, every lane is served
in turn, pushes of more than `slice_rows` are sliced and slices join groups of up to
`group_rows` rows, as before issue #12's item 6."""

from __future__ import annotations

import gc
import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from sqlalchemy import Engine

from server.store import counters
from server.store.fair_queue import CLOSED, FairQueue
from server.store.ids import GpuClaimConflict, IdCache, IdResolver
from server.store.samples import PreparedBatch, SampleWriter, UnresolvedBatch
from server.store.slices import row_count, split
from server.store.write_lock import WriteTurn

log = logging.getLogger(__name__)

# How long a writer waiting for the turn waits for new work before asking again.
_TURN_POLL_S = 0.0005
GPU_CONFLICTS = "laggard_ingest_gpu_conflicts_total"
_CONFLICT_LOG_EVERY_S = 60.0
REGISTRATION_COST_ROWS = 32  # what registering a node, GPU or port costs, in sample rows (_cost_in_rows)


@dataclass
class _Job:
    decode: Callable[[], UnresolvedBatch] | None
    done: Future
    key: str = ""
    batch: UnresolvedBatch | None = None
    prepared: PreparedBatch | None = None  # None: a node, GPU or NIC is new; built in the transaction
    whole: Future | None = None  # a slice's: the request's future, answered once every slice is stored
    heavy: bool = False  # a slice of a heavy push, or one costing more than small_rows: committed alone, after light jobs


def _is_heavy(job: _Job) -> bool:
    return job.heavy


class IngestWriter:
    def __init__(self, engine: Engine, *, threads: int = 1, group_max: int = 64, gpu_move_after_s: float = 300.0,
                 slice_rows: int = 128, large_body_bytes: int = 1 << 20, small_rows: int = 1024,
                 heavy_wait_s: float = 0.05, group_rows: int = 1024):
        self.engine = engine
        self.group_max = group_max
        self.gpu_move_after_s = gpu_move_after_s
        self.slice_rows = slice_rows
        self.large_body_bytes = large_body_bytes
        self.small_rows = small_rows
        self.group_rows = group_rows
        self.heavy_wait_s = heavy_wait_s
        self._heavy_since = time.monotonic()  # heavy jobs have waited since then (the last heavy commit)
        self._large = ThreadPoolExecutor(1, thread_name_prefix="ingest-decode-large")
        self.ids = IdCache()
        self._ids_lock = threading.Lock()
        self._rows = SampleWriter(engine.dialect.name)
        self._turn = WriteTurn.for_engine(engine)
        self._queue = FairQueue(heavy=_is_heavy)
        self._threads = [threading.Thread(target=self._run, name=f"ingest-writer-{i}", daemon=True) for i in range(threads)]
        self.committed_samples = 0
        self.failed_batches = 0
        self.gpu_conflicts = 0
        self._conflicts_logged: dict[tuple[str, str, str], float] = {}

    def start(self) -> None:
        # Decoding a batch allocates thousands of dicts, which keeps the cyclic garbage
        # collector busy, and its full passes walk every object of the process (app, ORM,
        # schemas): pauses of ~100 ms, the p99 of ingest. Frozen objects are left out.
        gc.collect()
        gc.freeze()
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        """Finish what was queued, then stop."""
        self._large.shutdown(wait=True)
        self._queue.close()
        for t in self._threads:
            t.join()
        self._turn.close()
        gc.unfreeze()  # what was frozen and has since become garbage can be collected again

    def submit(self, decode: Callable[[], UnresolvedBatch], key: str = "", body_bytes: int = 0) -> Future:
        """Queue a batch in `key`'s lane (the pushing token's); the future gives the number of
        samples committed, or raises what decode() or the database raised."""
        job = _Job(decode, Future(), key)
        if body_bytes > self.large_body_bytes:
            self._large.submit(self._decode_aside, job)
        else:
            self._queue.put(job, key)
        return job.done

    def _decode_aside(self, job: _Job) -> None:
        for ready in self._decoded(job) or []:
            self._queue.put(ready, job.key)

    def _run(self) -> None:
        while True:
            group, stop = self._gather()
            if group:
                try:
                    self._commit_group(group)
                finally:
                    self._turn.release()
                if group[0].heavy:
                    self._heavy_since = time.monotonic()  # heavy jobs wait from now on, if more do
            if stop:
                return

    def _gather(self) -> tuple[list[_Job], bool]:
        """Decode jobs into a group until the write turn is ours. Returns the group, with the
        turn held unless the group is empty, and whether to stop."""
        group: list[_Job] = []
        rows, full = 0, set()  # rows in the group; lanes whose next job would make it too large
        heavy_first = self._heavy_due()
        item = None
        while len(group) < self.group_max:
            # What is already queued joins the group; then the turn, if it is free. If another
            # process holds it, decode what arrives in the meantime. Only the first job of a
            # group may be heavy, and then it is the group.
            item = self._queue.get(0 if group else None, skip=full, heavy=not group, heavy_first=heavy_first and not group)
            if item is None:
                if self._turn.acquire(blocking=False):
                    return group, False
                item = self._queue.get(_TURN_POLL_S, skip=full, heavy=False)
                if item is None:
                    continue
            if item is CLOSED:
                break
            if not self._ready(item):
                continue
            # Prepared again if it was put back: ids it resolved may have moved meanwhile (a GPU
            # claimed by another node), and this is the moment it joins a group.
            self._prepare(item)
            cost = _cost_in_rows(item)
            if not item.heavy and 0 < self.small_rows < cost:
                item.heavy = True  # known only now that it is decoded (and its names looked up)
            if item.heavy:
                if self._alone(item, group, full, heavy_first):
                    group.append(item)
                    break
                continue
            if group and rows + cost > self.group_rows:
                self._queue.put_front([item], item.key)  # first in the next group
                full.add(item.key)
                continue
            group.append(item)
            rows += cost
        if group:
            self._turn.acquire()
        return group, item is CLOSED

    def _alone(self, job: _Job, group: list[_Job], full: set[str], heavy_first: bool) -> bool:
        """Whether the heavy job is the group; if not, it is put back first in its lane. It never
        joins light jobs in a transaction, and a light job of another lane that came meanwhile
        goes first (one of its own lane waits behind it: a token's pushes keep their order)."""
        if group or (not heavy_first and self._queue.waiting(heavy=False, skip={job.key})):
            self._queue.put_front([job], job.key)
            if group:
                full.add(job.key)
            return False
        return True

    def _heavy_due(self) -> bool:
        """Whether a heavy job goes first in the next group: heavy jobs have been passed over
        for `heavy_wait_s` while light ones were served."""
        now = time.monotonic()
        if not self._queue.waiting(heavy=True):
            self._heavy_since = now
            return False
        return now - self._heavy_since >= self.heavy_wait_s

    def _ready(self, job: _Job) -> bool:
        """Decode (once); False if the request was refused, or cut into slices, which now
        stand first in its lane."""
        if job.whole is not None and job.whole.done():
            job.done.cancel()  # an earlier slice failed and the request has its answer
            return False
        if job.batch is not None:
            return True
        jobs = self._decoded(job)
        if jobs is None:
            return False
        if len(jobs) == 1:
            return True
        self._queue.put_front(jobs, job.key)
        return False

    def _decoded(self, job: _Job) -> list[_Job] | None:
        """Decode: the job itself, or its slices (answering the job once all are stored);
        None if the request was refused."""
        try:
            job.batch = job.decode()
        except Exception as exc:  # the request's own fault: answered, never stored
            job.done.set_exception(exc)
            return None
        # A push is cut only if it is heavy: a light one (an agent's usual push, or a spool
        # replay of a minute) stays whole and joins a group commit with the others.
        light_up_to = self.small_rows if self.small_rows > 0 else self.slice_rows
        slices = split(job.batch, self.slice_rows) if row_count(job.batch) > light_up_to else [job.batch]
        if len(slices) == 1:
            return [job]
        parts = [_Job(None, Future(), job.key, batch, whole=job.done, heavy=self.small_rows > 0) for batch in slices]
        _answer_when_all_stored(job.done, [p.done for p in parts])
        return parts

    def _prepare(self, job: _Job) -> None:
        """Build the rows now if every id is known."""
        try:
            job.prepared = self._rows.prepare(IdResolver(None, self.ids), job.batch)
        except Exception:  # CacheMiss; anything else fails again, answered, in the transaction
            job.prepared = None

    def _commit_group(self, jobs: list[_Job]) -> None:
        try:
            outcomes = self._transaction(jobs)
        except Exception as exc:
            if len(jobs) == 1:
                self._fail(jobs[0], exc)
                return
            for job in jobs:
                self._commit_group([job])
            return
        for job, outcome in zip(jobs, outcomes):
            if isinstance(outcome, GpuClaimConflict):
                job.done.set_exception(outcome)
            else:
                job.done.set_result(outcome)

    def _transaction(self, jobs: list[_Job]) -> list[int | GpuClaimConflict]:
        """Commit the group; per job, the samples committed or the conflict that refused it
        (a refused batch wrote nothing: claims are checked before its first write)."""
        # Rows built before the turn used ids that were already committed; the turn covers
        # only the inserts and the commit.
        with self.engine.begin() as conn:
            resolver = IdResolver(conn, self.ids, move_after_s=self.gpu_move_after_s)
            outcomes: list[int | GpuClaimConflict] = []
            prepared = []
            for job in jobs:
                if job.prepared is None:
                    try:  # before the job's first write; a conflict found later fails the group
                        resolver.refuse_conflicting_claims(job.batch.claimant(), job.batch.gpus)
                    except GpuClaimConflict as conflict:
                        outcomes.append(conflict)
                        continue
                rows = job.prepared or self._rows.prepare(resolver, job.batch)
                prepared.append(rows)
                outcomes.append(rows.samples)
            self._rows.insert(conn, prepared)
            conflicts = [o for o in outcomes if isinstance(o, GpuClaimConflict)]
            if conflicts:
                counters.add(conn, [(GPU_CONFLICTS, {"cluster": c.cluster}, 1) for c in conflicts])
        # Only now, after COMMIT returned, are the rows durable and the new ids real.
        with self._ids_lock:
            self.ids.merge(resolver.staged)
            self.committed_samples += sum(p.samples for p in prepared)
            self.gpu_conflicts += len(conflicts)
        for conflict in conflicts:
            self._log_conflict(conflict)
        return outcomes

    def _log_conflict(self, conflict: GpuClaimConflict) -> None:
        # One line per GPU and claimant a minute: a misconfigured agent retries every push.
        key, now = (conflict.cluster, conflict.uuid, conflict.claimant), time.monotonic()
        if now - self._conflicts_logged.get(key, -math.inf) < _CONFLICT_LOG_EVERY_S:
            return
        if len(self._conflicts_logged) > 10_000:
            self._conflicts_logged.clear()
        self._conflicts_logged[key] = now
        log.warning("ingest: refused a batch (409): %s", conflict)

    def _fail(self, job: _Job, exc: Exception) -> None:
        if job.whole is not None and job.whole.done():
            job.done.cancel()
            return
        log.warning("ingest batch from node %s failed: %s", job.batch.node, exc)
        with self._ids_lock:
            self.failed_batches += 1
        job.done.set_exception(exc)


def _cost_in_rows(job: _Job) -> int:
    """What committing the job costs, in sample rows: a batch whose node, GPUs or ports are
    new registers each of them first, a few statements apiece (~0.35 ms, the cost of ~32 rows):
    thirty new names in one group held the writer for 190 ms."""
    rows = row_count(job.batch)
    if job.prepared is not None:
        return rows
    return rows + REGISTRATION_COST_ROWS * (1 + len(job.batch.gpus) + len(job.batch.nics))


def _answer_when_all_stored(whole: Future, parts: list[Future]) -> None:
    """`whole` gets the samples of every part once all are committed, or the first failure."""
    left = [len(parts)]
    lock = threading.Lock()

    def one_done(part: Future) -> None:
        if part.cancelled():
            return
        exc = part.exception()
        with lock:  # slices may be committed by several writer threads (PostgreSQL)
            left[0] -= 1
            if whole.done():
                return
            if exc is not None:
                whole.set_exception(exc)
            elif left[0] == 0:
                whole.set_result(sum(p.result() for p in parts))

    for part in parts:
        part.add_done_callback(one_done)
