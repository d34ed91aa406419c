"""The ingest writer's queue: one lane per token, served in turn (issue #12).

With one first-in-first-out queue, a token that keeps several of the largest batches queued had
every other agent's push wait behind all of them. Here each token (the key; anonymous requests
share one) has its own lane, and the writer takes from the lanes in turn, so a push waits behind
at most one job of each other busy token. Within a lane the order is kept."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterable

CLOSED = object()  # what get() returns once the queue is closed and empty


class FairQueue:
    def __init__(self) -> None:
        self._lanes: OrderedDict[str, deque] = OrderedDict()
        self._closed = False
        self._ready = threading.Condition()

    def put(self, item: object, key: str = "") -> None:
        with self._ready:
            self._lanes.setdefault(key, deque()).append(item)
            self._ready.notify()

    def put_front(self, items: Iterable[object], key: str = "") -> None:
        """Ahead of the lane's other jobs: the slices of a batch just taken, or a job given back."""
        with self._ready:
            self._lanes.setdefault(key, deque()).extendleft(reversed(list(items)))
            self._ready.notify()

    def close(self) -> None:
        """What is queued is still served; then get() returns CLOSED."""
        with self._ready:
            self._closed = True
            self._ready.notify_all()

    def get(self, timeout: float | None = None, skip: frozenset[str] | set[str] = frozenset()) -> object | None:
        """The next job of the next lane in turn that is not in `skip`; None if there is none
        within `timeout` seconds (None: wait as long as it takes)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._ready:
            while True:
                for key, lane in self._lanes.items():
                    if key not in skip:
                        item = lane.popleft()
                        if lane:
                            self._lanes.move_to_end(key)  # its next job waits for the other lanes' turn
                        else:
                            del self._lanes[key]
                        return item
                if self._closed and not self._lanes:
                    return CLOSED
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._ready.wait(left)

    def __len__(self) -> int:
        with self._ready:
            return sum(map(len, self._lanes.values()))
