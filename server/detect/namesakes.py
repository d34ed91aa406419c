"""The link rate each port name runs at across the nodes of a group, for the rate a port should
run at (the median of its namesakes on the *other* nodes).

Link rates are a handful of discrete speeds, so each port name keeps a count per rate: a port's
leave-one-out median costs the number of distinct rates, not the number of nodes, on every
observation of every port."""

from __future__ import annotations

from collections import Counter, defaultdict

_UNKNOWN = object()


class NamesakeRates:
    def __init__(self) -> None:
        self._rate_of: dict[str, dict[str, float]] = defaultdict(dict)  # port name → node → rate
        self._counts: dict[str, Counter] = defaultdict(Counter)  # port name → rate → nodes
        # port name → the rate left out → the median (None: no other node): asked for every port
        # at every instant, while the rates of a name change only when a link retrains.
        self._medians: dict[str, dict[float | None, float | None]] = defaultdict(dict)

    def observe(self, name: str, node: str, rate: float | None) -> float | None:
        """Record `node`'s rate for port `name`; the median of the other nodes' (None: none)."""
        own = self._rate_of[name].get(node)
        if rate is not None and rate != own:
            self._set(name, node, rate)
            own = rate
        medians = self._medians[name]
        median = medians.get(own, _UNKNOWN)
        if median is _UNKNOWN:
            counts = self._counts[name]
            others = sum(counts.values()) - (own is not None)
            median = medians[own] = _median(counts, others, own) if others > 0 else None
        return median

    def forget(self, node: str) -> None:
        for name, rates in self._rate_of.items():
            old = rates.pop(node, None)
            if old is not None:
                self._drop(name, old)

    def _set(self, name: str, node: str, rate: float) -> None:
        old = self._rate_of[name].get(node)
        if old == rate:
            return
        if old is not None:
            self._drop(name, old)
        self._rate_of[name][node] = rate
        self._counts[name][rate] += 1
        self._medians.pop(name, None)

    def _drop(self, name: str, rate: float) -> None:
        self._medians.pop(name, None)
        counts = self._counts[name]
        counts[rate] -= 1
        if counts[rate] <= 0:
            del counts[rate]


def _median(counts: Counter, n: int, leave_out: float | None) -> float:
    """The median of the multiset `counts` without one `leave_out` (n: its size after that)."""
    ordered = []
    for rate in sorted(counts):
        k = counts[rate] - (1 if rate == leave_out else 0)
        if k > 0:
            ordered.append((rate, k))

    def nth(i: int) -> float:
        for rate, k in ordered:
            if i < k:
                return rate
            i -= k
        raise IndexError(i)

    if n % 2:
        return nth(n // 2)
    return (nth(n // 2 - 1) + nth(n // 2)) / 2
