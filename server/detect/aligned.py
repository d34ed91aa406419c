"""One cluster's windows of one kind, aligned across its nodes (server/detect/across_window.py
KINDS): which windows a node measures once it is judged past their end, what its nodes measured
of the windows not judged yet, and, for a kind that carries, each node's latest measure of each
group, which stands for it in a window where it has none."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from server.detect.across_window import GroupMeasures, Kind, NodeMeasures


@dataclass
class AlignedWindows:
    kind: Kind
    width: float
    until: float  # end of the last window judged
    measures: dict[float, dict[str, NodeMeasures]] = field(default_factory=dict)  # windows not yet judged, by end, by node
    latest: dict[str, dict[str, tuple[float, GroupMeasures]]] = field(default_factory=dict)  # node → group → (end, measure)

    def ends_to_measure(self, measured_until: float, ts: float, keep_s: float, *, each_s: float | None = None) -> list[float]:
        """The ends of the windows a node judged to `ts` measures now (one, as a rule): past the
        last one judged and the last it measured, and whose samples it still holds (`keep_s`);
        with `each_s`, only those ending at a multiple of it."""
        width = self.width
        last = math.floor(ts / width) * width
        end = max(self.until, measured_until, math.floor((ts - keep_s) / width) * width + width) + width
        ends = []
        while end <= last:
            if each_s is None or (end / each_s).is_integer():
                ends.append(end)
            end += width
        return ends

    def take(self, until: float, horizon_s: float) -> tuple[list[NodeMeasures], list[NodeMeasures]]:
        """The window ending at `until`, judged now: its nodes' measures (by node name) and, for a
        kind that carries, the latest measures, up to horizon_s old, of the groups of nodes
        without one in it, which this window's then replace."""
        self.until = until
        measured = self.measures.pop(until, None) or {}
        fresh = [measured[n] for n in sorted(measured)]
        if not self.kind.carries or not measured:
            return fresh, []
        horizon, latest, carried = until - horizon_s, self.latest, []
        for node in sorted(latest):
            mine, groups = measured.get(node), latest[node]
            for group in [g for g, (end, _) in groups.items() if end < horizon]:
                del groups[group]
            kept = {g: m for g, (_, m) in groups.items() if mine is None or g not in mine.gpus}
            if kept:
                carried.append(NodeMeasures(node, kept, {}))
        for node in [n for n, groups in latest.items() if not groups]:
            del latest[node]
        for node, m in measured.items():
            latest.setdefault(node, {}).update((g, (until, gm)) for g, gm in m.gpus.items())
        return fresh, carried
