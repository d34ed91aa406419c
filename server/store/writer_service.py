"""One writer process for a collector with several worker processes on SQLite.

SQLite takes one writer at a time. When every worker wrote for itself (taking turns through
write_lock.py), each turn began with a page cache that another process had just invalidated,
and two workers ingested less than one. Here the workers do what parallelises (HTTP, gunzip,
validation, building rows keyed by the batch's own GPUs and NICs) and hand the rows to this
process, whose IngestWriter keeps its id cache and page cache warm and commits in groups. A
worker answers 200 only when this process has replied that the batch is committed.

Transport: multiprocessing.connection over a Unix socket, authenticated with a per-start key;
messages are (request id, UnresolvedBatch) one way and (request id, kind, value) back.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import multiprocessing
import os
import shutil
import signal
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Client, Connection, Listener
from typing import Any, Callable

from pydantic import SecretStr

from server.store.engine import database_unavailable, disk_full, make_engine
from server.store.ids import GpuClaimConflict
from server.store.samples import UnresolvedBatch
from server.store.writer import IngestWriter

log = logging.getLogger(__name__)

COMMITTED, UNAVAILABLE, DISK_FULL, FAILED, CONFLICT = "committed", "unavailable", "disk full", "failed", "conflict"


class WriterUnavailable(ConnectionError):
    """The writer process could not store the batch now (database down, or the process gone):
    nothing was committed, and the agent should retry."""


class WriterDiskFull(WriterUnavailable):
    """The writer process found no space left for the database: nothing was committed."""


class WriterFailed(RuntimeError):
    """The writer process failed the batch for a reason that retrying will not fix."""


# --- the supervisor side (laggard server --workers N) ---------------------------------------

class WriterProcess:
    """Starts the writer process and tells workers (through LAGGARD_* variables) where it is."""

    def __init__(self, database_url: str, *, group_max: int, gpu_move_after_s: float = 300.0):
        self.database_url = database_url
        self.group_max = group_max
        self.gpu_move_after_s = gpu_move_after_s
        self._dir = tempfile.mkdtemp(prefix="laggard-writer-")
        self.address = os.path.join(self._dir, "writer.sock")
        self.authkey = os.urandom(32)
        self.process: multiprocessing.process.BaseProcess | None = None

    @property
    def worker_settings(self) -> dict[str, Any]:
        """What a worker's Settings need to write through this process (as Settings fields)."""
        return {"ingest_writer_socket": self.address, "ingest_writer_key": SecretStr(self.authkey.hex())}

    def start(self, timeout: float = 60.0) -> None:
        ctx = multiprocessing.get_context("spawn")
        ready = ctx.Event()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.address)  # a writer that died leaves its socket file behind
        self.process = ctx.Process(target=serve, args=(self.address, self.authkey, self.database_url, self.group_max, ready, self.gpu_move_after_s),
                                   name="laggard-writer", daemon=False)
        self.process.start()
        if not ready.wait(timeout):
            self.process.terminate()
            raise RuntimeError("the ingest writer process did not start")

    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    def stop(self, timeout: float = 30.0) -> None:
        """After the workers: SIGTERM, so it commits what it holds, then clean up."""
        if self.process is not None and self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout)
            if self.process.is_alive():
                self.process.kill()
        shutil.rmtree(self._dir, ignore_errors=True)


# --- the writer process ---------------------------------------------------------------------

def serve(address: str, authkey: bytes, database_url: str, group_max: int, ready: Any = None, gpu_move_after_s: float = 300.0) -> None:
    """Entry point of the writer process: accept worker connections until SIGTERM, then
    finish what was queued."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    # Ctrl-C reaches the whole process group: the supervisor stops the workers first, then
    # sends this process SIGTERM, so that requests still in flight can be committed.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    engine = make_engine(database_url)
    writer = IngestWriter(engine, threads=1, group_max=group_max, gpu_move_after_s=gpu_move_after_s)
    writer.start()
    # The default backlog is 1: workers connecting at the same moment (each one's handshake
    # holds the accept loop) were refused, and a worker refused at start failed its startup.
    listener = Listener(address, family="AF_UNIX", backlog=128, authkey=authkey)
    threading.Thread(target=_accept, args=(listener, writer), name="writer-accept", daemon=True).start()
    if ready is not None:
        ready.set()
    stop.wait()
    listener.close()
    writer.stop()  # replies to everything already received go out before the process ends
    engine.dispose()


def _accept(listener: Listener, writer: IngestWriter) -> None:
    while True:
        try:
            conn = listener.accept()
        except OSError:
            return  # listener closed: shutting down
        except Exception:  # a client that failed the handshake; keep serving the others
            log.warning("writer: refused a connection", exc_info=True)
            continue
        threading.Thread(target=_serve_connection, args=(conn, writer), name="writer-conn", daemon=True).start()


def _serve_connection(conn: Connection, writer: IngestWriter) -> None:
    send_lock = threading.Lock()

    def reply(request_id: int, done: Future) -> None:
        exc = done.exception()
        if exc is None:
            message = (request_id, COMMITTED, done.result())
        elif isinstance(exc, GpuClaimConflict):
            message = (request_id, CONFLICT, exc.fields())
        else:
            message = (request_id, _failure_kind(exc), f"{type(exc).__name__}: {exc}")
        try:
            with send_lock:
                conn.send(message)
        except OSError:
            pass  # the worker is gone; it answered its client with a 503 already

    while True:
        try:
            request_id, batch = conn.recv()
        except (EOFError, OSError):
            conn.close()
            return
        done = writer.submit(lambda batch=batch: batch)
        done.add_done_callback(lambda f, request_id=request_id: reply(request_id, f))


def _failure_kind(exc: BaseException) -> str:
    if disk_full(exc):
        return DISK_FULL
    return UNAVAILABLE if database_unavailable(exc) else FAILED


# --- the worker side ------------------------------------------------------------------------

class RemoteWriter:
    """IngestWriter's interface (submit, start, stop, counters) in a worker process: decodes
    on a thread of its own, then waits for the writer process's commit."""

    def __init__(self, address: str, authkey: bytes):
        self.address = address
        self.authkey = authkey
        self.committed_samples = 0
        self.failed_batches = 0
        self._decoder = ThreadPoolExecutor(1, thread_name_prefix="ingest-decode")
        self._conn: Connection | None = None
        self._pending: dict[int, Future] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count()

    def start(self) -> None:
        try:
            self._connect()
        except WriterUnavailable as exc:
            # Not fatal: every request connects if there is no connection (503 until it can).
            log.warning("ingest writer process not reachable yet (%s); connecting on the first request", exc)

    def stop(self, timeout: float = 30.0) -> None:
        self._decoder.shutdown(wait=True)
        with self._lock:
            waiting = list(self._pending.values())
        for done in waiting:
            try:
                done.exception(timeout=timeout)
            except TimeoutError:
                break
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def submit(self, decode: Callable[[], UnresolvedBatch], key: str = "", body_bytes: int = 0) -> Future:
        # The writer process keeps one lane for all workers; it still commits large batches in slices.
        done: Future = Future()
        self._decoder.submit(self._decode_and_send, decode, done)
        return done

    def _decode_and_send(self, decode: Callable[[], UnresolvedBatch], done: Future) -> None:
        try:
            batch = decode()
        except Exception as exc:  # the request's own fault: answered here, never sent
            done.set_exception(exc)
            return
        request_id = next(self._ids)
        try:
            with self._lock:
                conn = self._conn or self._connect_locked()
                self._pending[request_id] = done
                conn.send((request_id, batch))
        except OSError as exc:
            self._lost(exc)
            if not done.done():
                done.set_exception(exc if isinstance(exc, WriterUnavailable) else WriterUnavailable(f"ingest writer process lost: {exc}"))

    def _connect(self) -> None:
        with self._lock:
            self._connect_locked()

    def _connect_locked(self) -> Connection:
        try:
            conn = Client(self.address, family="AF_UNIX", authkey=self.authkey)
        except OSError as exc:
            raise WriterUnavailable(f"ingest writer process unreachable: {exc}") from exc
        self._conn = conn
        threading.Thread(target=self._receive, args=(conn,), name="ingest-replies", daemon=True).start()
        return conn

    def _receive(self, conn: Connection) -> None:
        while True:
            try:
                request_id, kind, value = conn.recv()
            except (EOFError, OSError) as exc:
                self._lost(exc, conn)
                return
            with self._lock:
                done = self._pending.pop(request_id, None)
            if done is None:
                continue
            if kind == COMMITTED:
                self.committed_samples += value
                done.set_result(value)
            elif kind == CONFLICT:
                done.set_exception(GpuClaimConflict(**value))
            else:
                self.failed_batches += 1
                done.set_exception(_REMOTE_FAILURES[kind](value))

    def _lost(self, exc: BaseException, conn: Connection | None = None) -> None:
        """The writer process went away: whatever it had not confirmed may not be stored, so
        every waiting request gets a 503 and its agent sends the batch again."""
        with self._lock:
            if conn is None or conn is self._conn:
                self._conn = None
            pending, self._pending = self._pending, {}
        for done in pending.values():
            if not done.done():
                done.set_exception(WriterUnavailable(f"ingest writer process lost: {exc}"))
        if conn is not None:
            conn.close()


_REMOTE_FAILURES = {UNAVAILABLE: WriterUnavailable, DISK_FULL: WriterDiskFull, FAILED: WriterFailed}
