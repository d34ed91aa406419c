"""The ingest writer: request handlers hand it batches and wait for the commit.

Batches that arrive together are committed in one transaction (group commit), which keeps
fsync-per-acknowledgement durability affordable. If a group fails, each batch is retried on
its own so one bad batch cannot sink its neighbours."""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass

from sqlalchemy import Engine

from server.protocol import Batch
from server.store.ids import IdCache, IdResolver
from server.store.samples import SampleWriter

log = logging.getLogger(__name__)


@dataclass
class _Job:
    batch: Batch
    done: Future


_STOP = object()


class IngestWriter:
    def __init__(self, engine: Engine, *, threads: int = 1, group_max: int = 64):
        self.engine = engine
        self.group_max = group_max
        self.ids = IdCache()
        self._ids_lock = threading.Lock()
        self._rows = SampleWriter(engine.dialect.name)
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

    def submit(self, batch: Batch) -> Future:
        done: Future = Future()
        self._queue.put(_Job(batch, done))
        return done

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is _STOP:
                return
            jobs = [first]
            stop_after = False
            while len(jobs) < self.group_max:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stop_after = True
                    break
                jobs.append(nxt)
            self._commit_group(jobs)
            if stop_after:
                return

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
        with self.engine.begin() as conn:
            resolver = IdResolver(conn, published)
            counts = [self._rows.write(conn, resolver, job.batch) for job in jobs]
        # Only now, after COMMIT returned, are the rows durable and the new ids real.
        with self._ids_lock:
            self.ids.merge(resolver.staged)
            self.committed_samples += sum(counts)
        return counts

    def _fail(self, job: _Job, exc: Exception) -> None:
        log.warning("ingest batch from node %s failed: %s", job.batch.node, exc)
        with self._ids_lock:
            self.failed_batches += 1
        job.done.set_exception(exc)
