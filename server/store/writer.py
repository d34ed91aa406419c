"""The ingest writer: request handlers hand it validated batches and wait for the commit.

The handler decodes (gunzip + validate) and, when every id is already cached, builds the rows
itself, on the event loop: in a process bound by the GIL, CPU work costs the same on any
thread, and each hand-over between threads costs a GIL switch on top. The writer thread is
left with what is mostly outside the GIL (SQLite's row steps, the commit's fsync), so it
rarely makes the event loop wait. Batches that arrive together are committed in one
transaction (group commit); if a group fails, each batch is retried on its own so one bad
batch cannot sink its neighbours."""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass

from sqlalchemy import Engine

from server.protocol import Batch
from server.store.ids import CacheMiss, IdCache, IdResolver
from server.store.samples import PreparedBatch, SampleWriter
from server.store.write_lock import WriteTurn

log = logging.getLogger(__name__)


@dataclass
class _Job:
    batch: Batch
    prepared: PreparedBatch | None  # None: a node, GPU or NIC is new; built in the transaction
    done: Future


_STOP = object()


class IngestWriter:
    def __init__(self, engine: Engine, *, threads: int = 1, group_max: int = 64):
        self.engine = engine
        self.group_max = group_max
        self.ids = IdCache()
        self._ids_lock = threading.Lock()
        self._rows = SampleWriter(engine.dialect.name)
        self._turn = WriteTurn.for_engine(engine)
        self._queue: queue.Queue = queue.Queue()
        self._threads = [threading.Thread(target=self._run, name=f"ingest-writer-{i}", daemon=True) for i in range(threads)]
        self.committed_samples = 0
        self.failed_batches = 0

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        """Finish what was queued, then stop."""
        for _ in self._threads:
            self._queue.put(_STOP)
        for t in self._threads:
            t.join()
        self._turn.close()

    def submit(self, batch: Batch) -> Future:
        """Queue a validated batch; the future gives the number of samples committed, or raises
        what the database raised. Runs in the caller's thread."""
        try:
            prepared = self._rows.prepare(IdResolver(None, self.ids), batch)
        except CacheMiss:
            prepared = None
        done: Future = Future()
        self._queue.put(_Job(batch, prepared, done))
        return done

    def _run(self) -> None:
        while True:
            jobs, stop = self._take()
            if jobs:
                self._commit_group(jobs)
            if stop:
                return

    def _take(self) -> tuple[list[_Job], bool]:
        first = self._queue.get()
        if first is _STOP:
            return [], True
        jobs = [first]
        while len(jobs) < self.group_max:
            try:
                nxt = self._queue.get_nowait()
            except queue.Empty:
                break
            if nxt is _STOP:
                return jobs, True
            jobs.append(nxt)
        return jobs, False

    def _commit_group(self, jobs: list[_Job]) -> None:
        try:
            counts = self._transaction(jobs)
        except Exception as exc:
            if len(jobs) == 1:
                self._fail(jobs[0], exc)
                return
            for job in jobs:
                self._commit_group([job])
            return
        for job, count in zip(jobs, counts):
            job.done.set_result(count)

    def _transaction(self, jobs: list[_Job]) -> list[int]:
        # Rows built at submit() used ids that were already committed; the write turn
        # (serialised across worker processes) covers only the inserts and the commit.
        with self._turn.held(), self.engine.begin() as conn:
            resolver = IdResolver(conn, self.ids)
            counts = [self._rows.insert(conn, job.prepared or self._rows.prepare(resolver, job.batch)) for job in jobs]
        # Only now, after COMMIT returned, are the rows durable and the new ids real.
        with self._ids_lock:
            self.ids.merge(resolver.staged)
            self.committed_samples += sum(counts)
        return counts

    def _fail(self, job: _Job, exc: Exception) -> None:
        log.warning("ingest batch from node %s failed: %s", job.batch["node"], exc)
        with self._ids_lock:
            self.failed_batches += 1
        job.done.set_exception(exc)
