"""NvmlGpuSource: one GpuSample per GPU per sample, from NVML through the readers.

Failure isolation is the point: a reader that errors on one GPU costs that reader's fields
on that GPU only; a GPU that is gone is reported as lost (so the server sees it go) while
the others are read normally.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import pynvml
from pynvml import NVMLError

from agent.nvml.readers import READERS, Reader, bind_readers
from agent.nvml.session import NvmlSession, is_lost, is_unsupported
from agent.nvml.xid import XidWatcher
from agent.sample import GpuSample
from agent.workload.node import NodeAttribution

log = logging.getLogger(__name__)


def unknown_uuid(index: int) -> str:
    return f"GPU-unknown-{index}"


class _GpuLost(Exception):
    pass


# The static facts (readers with static=True) are read again this often even when the GPU
# keeps its handle: cheap insurance against a fact that changes under a long-lived handle.
STATIC_REFRESH_S = 600.0

_FACT_FIELDS = tuple(f.name for f in dataclasses.fields(GpuSample) if f.name not in {"index", "lost", "workload", "xids"})


class NvmlGpuSource:
    """Reads every GPU NVML enumerates. Not thread-safe: one sampling thread per source."""

    def __init__(self, readers: list[Reader] | None = None, attribution: NodeAttribution | None = None) -> None:
        """attribution: what uses each GPU (agent/workload/), asked once per read for every
        GPU; None: off (every GpuSample.workload stays None, unknown)."""
        self.attribution = attribution
        self._attribution_failed = False
        self._session = NvmlSession()
        try:
            self._count = pynvml.nvmlDeviceGetCount()
        except BaseException:
            self._session.close()
            raise
        self._readers = bind_readers(READERS if readers is None else readers)
        self._static_readers = [r for r in self._readers if r.static]
        self._live_readers = [r for r in self._readers if not r.static]
        self._handles: list[object | None] = [None] * self._count
        # Per GPU: (field, value) pairs the static readers filled in, and when; None = read them.
        self._facts: list[tuple[tuple[tuple[str, object], ...], float] | None] = [None] * self._count
        self._uuids: list[str | None] = [None] * self._count
        self._xid = XidWatcher()
        # Per-reader counters for a metrics endpoint: calls, failures (NotSupported is not a
        # failure), and seconds spent, summed over GPUs.
        self.reader_runs: dict[str, int] = {r.name: 0 for r in self._readers}
        self.reader_errors: dict[str, int] = {r.name: 0 for r in self._readers}
        self.reader_seconds: dict[str, float] = {r.name: 0.0 for r in self._readers}
        self.gpus_lost = 0
        self._logged: set[tuple[str, int, str]] = set()
        for index in range(self._count):
            self._lookup(index)

    # -- info --------------------------------------------------------------------------
    @property
    def gpu_count(self) -> int:
        return self._count

    def driver_version(self) -> str | None:
        return self._session.driver_version()

    def cuda_version(self) -> str | None:
        return self._session.cuda_version()

    @property
    def xid(self) -> XidWatcher:
        return self._xid

    # -- sampling ----------------------------------------------------------------------
    def read(self, ts: float) -> list[GpuSample]:
        xids = self._xid.poll(ts)
        samples = [self._read_gpu(index) for index in range(self._count)]
        for sample in samples:
            sample.xids = xids.get(sample.index, [])
        self.gpus_lost = sum(1 for s in samples if s.lost)
        if self.attribution is not None:
            self._attribute(samples)
        return samples

    def _attribute(self, samples: list[GpuSample]) -> None:
        """Each sample's workload, one attribution call for all GPUs (a lost GPU: None). A
        failure leaves them None (unknown) and never stops sampling; its counters tell why."""
        handles = [None if s.lost else self._handles[s.index] for s in samples]
        try:
            found = self.attribution.read(handles)
        except Exception:
            if not self._attribution_failed:  # once, not every sample
                self._attribution_failed = True
                log.warning("workload attribution failed; GPU workloads left unknown", exc_info=True)
            return
        for sample, workload in zip(samples, found):
            sample.workload = workload

    def _read_gpu(self, index: int) -> GpuSample:
        handle = self._handles[index] or self._lookup(index)
        if handle is None:
            return self._lost(index)
        gpu = GpuSample(index=index, uuid=self._uuids[index] or unknown_uuid(index))
        try:
            answered = self._run_readers(index, handle, gpu)
        except _GpuLost:
            self._handles[index] = None  # look it up afresh next time: it may come back
            return self._lost(index)
        if answered == 0:
            self._handles[index] = None  # nothing worked: maybe a stale handle, look it up again
        if gpu.uuid != unknown_uuid(index):
            self._uuids[index] = gpu.uuid
        return gpu

    def _run_readers(self, index: int, handle: object, gpu: GpuSample) -> int:
        """Run the readers on one GPU; how many the GPU answered. Raises _GpuLost.

        Static facts read earlier are copied in, not read: they count as neither answered
        nor failed, so a GPU that now answers nothing is still found unreachable."""
        answered = unknown = 0  # readers the GPU answered (data or NotSupported); UNKNOWN failures
        facts = self._facts[index]
        now = time.monotonic()
        if facts is not None and now - facts[1] < STATIC_REFRESH_S:
            for name, value in facts[0]:
                setattr(gpu, name, value)
        else:
            answered, unknown, failed = self._run(self._static_readers, index, handle, gpu)
            if not failed:  # a fact that could not be read now is tried again next time
                known = tuple((name, getattr(gpu, name)) for name in _FACT_FIELDS if getattr(gpu, name) is not None)
                self._facts[index] = (known, now)
        live_answered, live_unknown, _ = self._run(self._live_readers, index, handle, gpu)
        answered += live_answered
        unknown += live_unknown
        if answered == 0 and unknown:
            # Nothing answered and the driver cannot say why: unreachable, same as lost.
            raise _GpuLost
        return answered

    def _run(self, readers: list[Reader], index: int, handle: object, gpu: GpuSample) -> tuple[int, int, int]:
        """(answered, failed with UNKNOWN, failed) over these readers. Raises _GpuLost."""
        answered = unknown = failed = 0
        runs, seconds = self.reader_runs, self.reader_seconds
        for reader in readers:
            start = time.perf_counter()
            try:
                reader.read(handle, gpu)
                answered += 1
            except NVMLError as err:
                if is_lost(err):
                    raise _GpuLost from err
                if is_unsupported(err):
                    answered += 1
                else:
                    unknown += err.value == pynvml.NVML_ERROR_UNKNOWN
                    failed += 1
                    self._failed(reader.name, index, err)
            except Exception as err:  # a bug in one reader must not cost the others
                failed += 1
                self._failed(reader.name, index, err)
            finally:
                name = reader.name
                runs[name] = runs.get(name, 0) + 1
                seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - start
        return answered, unknown, failed

    def _failed(self, name: str, index: int, err: BaseException) -> None:
        self.reader_errors[name] = self.reader_errors.get(name, 0) + 1
        key = (name, index, type(err).__name__)
        if key not in self._logged:  # once per reader/GPU/kind, not every sample
            self._logged.add(key)
            log.warning("reader %s failed on GPU %d: %r", name, index, err, exc_info=not isinstance(err, NVMLError))

    def _lost(self, index: int) -> GpuSample:
        return GpuSample(index=index, uuid=self._uuids[index] or unknown_uuid(index), lost=True)

    def _lookup(self, index: int) -> object | None:
        """Handle for GPU `index`, or None if NVML cannot reach it (reported lost)."""
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except NVMLError as err:
            # No handle means no metrics at all, whatever the code; the GPU is reported lost
            # rather than dropped so the server notices it disappear.
            log.debug("GPU %d: no handle: %s", index, err)
            return None
        try:
            self._uuids[index] = str(pynvml.nvmlDeviceGetUUID(handle))
        except NVMLError as err:
            if is_lost(err):
                return None
        self._handles[index] = handle
        self._facts[index] = None  # a new handle: read its static facts again
        self._xid.register(index, handle, self._uuids[index])
        return handle

    def close(self) -> None:
        if self.attribution is not None:
            self.attribution.close()
        self._xid.close()
        if self._session.is_open:  # reader state (GPM samples) goes back before nvmlShutdown
            for reader in self._readers:
                if reader.close is not None:
                    reader.close()
        self._session.close()

    def __enter__(self) -> NvmlGpuSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
