"""The ingest writer's queue: one lane per token, served in turn (issue #12).

With one first-in-first-out queue, a token that keeps several of the largest batches queued had
every other agent's push wait behind all of them. Here each token (the key; anonymous requests
share one) has its own lane, and the writer takes from the lanes in turn, so a push waits behind
at most one job of each other busy token. Within a lane the order is kept.

Lanes whose next job is heavy (`heavy(job)`: a slice of a large batch, or a batch of many rows)
are served after those whose next job is light, unless the caller asks for heavy first: a
small push does not wait for a slice of every heavy lane in turn (writer.py decides when)."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable

CLOSED = object()  # what get() returns once the queue is closed and empty


def _never_heavy(_item: object) -> bool:
    return False


class FairQueue:
    def __init__(self, heavy: Callable[[object], bool] = _never_heavy) -> None:
        self._lanes: OrderedDict[str, deque] = OrderedDict()
        self._heavy = heavy
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

    def get(self, timeout: float | None = None, skip: frozenset[str] | set[str] = frozenset(), *,
            heavy: bool = True, heavy_first: bool = False) -> object | None:
        """The next job of the next lane in turn that is not in `skip`, lanes whose next job is
        light first (`heavy_first`: heavy first), heavy ones only if `heavy`; None if there is
        none within `timeout` seconds (None: wait as long as it takes)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._ready:
            while True:
                key = self._next_lane(skip, heavy, heavy_first)
                if key is not None:
                    lane = self._lanes[key]
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

    def _next_lane(self, skip, heavy: bool, heavy_first: bool) -> str | None:
        first_light = first_heavy = None
        for key, lane in self._lanes.items():
            if key in skip:
                continue
            if not self._heavy(lane[0]):
                if not heavy_first:
                    return key
                first_light = key if first_light is None else first_light
            elif heavy:
                if heavy_first:
                    return key
                first_heavy = key if first_heavy is None else first_heavy
        return first_light if first_light is not None else first_heavy

    def waiting(self, heavy: bool, skip: frozenset[str] | set[str] = frozenset()) -> bool:
        """Whether the next job of a lane not in `skip` is heavy (light)."""
        with self._ready:
            return any(self._heavy(lane[0]) == heavy for key, lane in self._lanes.items() if key not in skip)

    def __len__(self) -> int:
        with self._ready:
            return sum(map(len, self._lanes.values()))
