"""Byte counters as a driver that caches its statistics serves them: the value at its last
refresh, every second or two, not the value at the moment of the read (drivers that cannot
read the hardware at every read refresh a copy periodically: kernel Documentation/networking/
statistics.rst). Sampled at 1 s, an interval holds 0, 1 or 2 refreshes: while a device's
refreshes cross the agent's sampling phase (every 1 s) or at every other sample (every 2 s),
its port or link reads 0, then twice its traffic. Sampled at 5 s, an interval holds 4-6
refreshes, or 2 or 3: its traffic reads ±20% off at every sample."""

from __future__ import annotations

import math
from random import Random

SHARE = 0.25  # of the nodes
# Every second or every two (a node's drivers), re-armed after each refresh has run: a little
# over, so the refreshes drift through the agent's sampling phase (a full sweep every ~250 s
# or ~500 s).
EVERY_S = (1.004, 2.004)


def draw(seed: int, idx: int) -> tuple[float, int] | None:
    """(period in seconds, seed of its devices' phases) for about a quarter of the nodes, else
    None: each node's own draw, so adding nodes (serving.py) changes no other node."""
    rng = Random(f"{seed}:cached:{idx}")
    if rng.random() >= SHARE:
        return None
    return rng.choice(EVERY_S), rng.randrange(1 << 30)


class CachedCounters:
    """The counters of one node as its agent reads them. Each device (a port's HCA, a GPU)
    refreshes on its own phase: one node's ports read 0 at different samples."""

    def __init__(self, every: float, seed: int):
        self.every, self.seed = every, seed
        self.phases: dict[object, float] = {}
        self.last: dict[tuple, tuple[float, int, int]] = {}  # key → (time, true value, value shown)

    def _phase(self, device: object) -> float:
        phase = self.phases.get(device)
        if phase is None:
            phase = self.phases[device] = Random(f"{self.seed}:{device}").uniform(0.0, self.every)
        return phase

    def shown(self, key: tuple, ts: float, true: int) -> int:
        """`key`: (counter, device)."""
        phase = self._phase(key[1])
        refreshed = phase + math.floor((ts - phase) / self.every) * self.every
        seen = self.last.get(key)
        if seen is None or true < seen[1]:  # the first read, or a reset: the hardware's value
            value = true
        elif refreshed <= seen[0]:  # no refresh since the previous read
            value = seen[2]
        else:  # the counter as it stood at the refresh, moving evenly over the interval
            t_prev, true_prev, shown_prev = seen
            value = max(shown_prev, true_prev + int((true - true_prev) * (refreshed - t_prev) / (ts - t_prev)))
        self.last[key] = (ts, true, value)
        return value
