"""The ingest writer: request handlers hand it work and wait for the commit.

A job carries a `decode` callable (gunzip + validate) that runs here, on the writer thread,
not on the event loop: with both CPU-heavy steps on one thread, the event loop stays free for
I/O and the writer is not starved of the GIL between SQLite's row steps (docs/performance.md).
Batches that arrive together are committed in one transaction (group commit); if a group
fails, each batch is retried on its own so one bad batch cannot sink its neighbours."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
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
    decode: Callable[[], Batch]
    done: Future
    batch: Batch | None = None
    prepared: PreparedBatch | None = None


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

    def submit(self, decode: Callable[[], Batch]) -> Future:
        """Queue a batch; the future gives the number of samples committed, or raises what
        decode() or the database raised."""
        done: Future = Future()
        self._queue.put(_Job(decode, done))
        return done

    def _run(self) -> None:
        while True:
            jobs, stop = self._take()
            decoded = [job for job in jobs if self._decode(job)]
            if decoded:
                self._commit_group(decoded)
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

    @staticmethod
    def _decode(job: _Job) -> bool:
        try:
            job.batch = job.decode()
        except Exception as exc:  # the request's own fault: answered, never stored
            job.done.set_exception(exc)
            return False
        return True

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
        with self._ids_lock:
            published = self.ids
        offline = IdResolver(None, published)
        for job in jobs:
            # Rows are built before taking the write turn when every id is already known,
            # so the turn (serialised across worker processes) covers only the inserts.
            try:
                job.prepared = self._rows.prepare(offline, job.batch)
            except CacheMiss:
                job.prepared = None
        with self._turn.held(), self.engine.begin() as conn:
            resolver = IdResolver(conn, published)
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
