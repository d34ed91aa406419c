"""XID critical errors through an NVML event set, polled (never blocking) once per sample.

The driver queues XID events per event set from the moment a device is registered, so a
zero-timeout wait after every sample picks up everything since the last one without a
dedicated thread.
"""

from __future__ import annotations

import ctypes
import logging

import pynvml
from pynvml import NVMLError

from agent.nvml.session import is_unsupported
from agent.sample import XidEvent

log = logging.getLogger(__name__)

# Upper bound on events taken per poll, so a GPU spewing XIDs cannot stall sampling.
MAX_EVENTS_PER_POLL = 1024


def _address(handle) -> int | None:
    """The opaque nvmlDevice_t pointer value: how an event names its device."""
    return ctypes.cast(handle, ctypes.c_void_p).value


class XidWatcher:
    def __init__(self) -> None:
        self._set = None
        self._disabled = False
        self._by_address: dict[int, int] = {}  # device pointer -> GPU index
        self._by_uuid: dict[str, int] = {}
        self.events_total = 0
        self.unmatched_total = 0
        self.errors_total = 0

    @property
    def enabled(self) -> bool:
        return self._set is not None

    def register(self, index: int, handle, uuid: str | None) -> bool:
        """Watch XIDs of one GPU; False if this driver/GPU cannot report them."""
        if self._disabled:
            return False
        if self._set is None:
            try:
                self._set = pynvml.nvmlEventSetCreate()
            except NVMLError as err:
                # Without event sets (old driver, no permission) XIDs just stay unreported.
                self._disabled = True
                log.info("XID events unavailable: %s", err)
                return False
        try:
            pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, self._set)
        except NVMLError as err:
            if not is_unsupported(err):
                self.errors_total += 1
                log.warning("GPU %d: cannot register for XID events: %s", index, err)
            return False
        address = _address(handle)
        if address is not None:
            self._by_address[address] = index
        if uuid:
            self._by_uuid[uuid] = index
        return True

    def poll(self, ts: float) -> dict[int, list[XidEvent]]:
        """Drain every pending event; XIDs grouped by GPU index, stamped with the sample time."""
        found: dict[int, list[XidEvent]] = {}
        if self._set is None:
            return found
        for _ in range(MAX_EVENTS_PER_POLL):
            try:
                data = pynvml.nvmlEventSetWait_v2(self._set, 0)
            except pynvml.NVMLError_Timeout:
                break  # queue empty
            except NVMLError as err:
                self.errors_total += 1
                log.warning("XID event wait failed: %s", err)
                break
            if not data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                continue
            index = self._match(data.device)
            if index is None:
                self.unmatched_total += 1
                continue
            self.events_total += 1
            found.setdefault(index, []).append(XidEvent(xid=int(data.eventData), ts=ts))
        return found

    def _match(self, device) -> int | None:
        address = _address(device)
        if address is not None and address in self._by_address:
            return self._by_address[address]
        try:  # a handle we did not see (re-enumeration): fall back to the uuid
            uuid = str(pynvml.nvmlDeviceGetUUID(device))
        except NVMLError:
            return None
        return self._by_uuid.get(uuid)

    def close(self) -> None:
        if self._set is not None:
            try:
                pynvml.nvmlEventSetFree(self._set)
            except NVMLError:
                pass
            self._set = None
