"""Stored sample rows → observations: readings copied as stored, plus per-second rates and
increases from counter deltas against the same GPU's or port's previous sample. Which readings
are copied and which counters become which rate is agent/fields.py's (`detect`, `rate`, `delta`).

This runs for every GPU and port at every instant (half the detector's CPU once). A loop over
the table per row cost 60% more than the hand-written code it replaced, so, as dataclasses and
namedtuple do, the two functions that read a row are generated from the table once, at import,
as the straight-line code a person would have written (`Recipe.source` shows it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent import fields
from server.detect.model import GpuObs, NicObs, copied_readings, derived_names


class Recipe:
    """How one table's rows become an observation's readings (`copy(row)`) and its rates and
    increases (`derive(row, prev)`), both tuples in the observation's order. A counter that
    decreased was reset (a driver reload, a reboot): no rate or increase across it; without a
    previous sample or with no time between the two, no rate."""

    def __init__(self, readings: tuple[fields.Reading, ...]):
        copied = copied_readings(readings)
        counters = [r for r in readings if r.rate or r.delta]
        rates, deltas = derived_names(readings)
        d = {r.name: f"d{i}" for i, r in enumerate(counters)}
        lines = ["def copy(row):", f"    return ({''.join(_copied(r) + ', ' for r in copied)})", "",
                 "def derive(row, prev):", "    if prev is None:", f"        return {(None,) * (len(rates) + len(deltas))!r}",
                 '    dt = row["ts"] - prev["ts"]']
        for r in counters:
            lines += [f"    a, b = prev.get({r.name!r}), row.get({r.name!r})",
                      f"    {d[r.name]} = None if a is None or b is None or b < a else b - a"]
        rate_exprs = []
        for name in rates:
            parts = [d[r.name] for r in counters if r.rate == name]
            rate_exprs.append(f"None if dt <= 0 or {' or '.join(f'{p} is None' for p in parts)} else ({' + '.join(parts)}) / dt")
        delta_exprs = [next(d[r.name] for r in counters if r.delta == name) for name in deltas]
        lines.append(f"    return ({''.join(e + ', ' for e in (*rate_exprs, *delta_exprs))})")
        self.source = "\n".join(lines)
        namespace: dict[str, Any] = {}
        exec(compile(self.source, f"<observe recipe: {', '.join(d) or 'no counters'}>", "exec"), namespace)
        self.copy, self.derive = namespace["copy"], namespace["derive"]
        # What a reader of stored samples must fetch for these observations.
        self.columns = tuple(dict.fromkeys((*(r.name for r in copied), *(r.name for r in counters))))


def _copied(reading: fields.Reading) -> str:
    value = f"row[{reading.name!r}]"
    if reading.type is not bool:
        return value
    # Stored as 0/1 on SQLite.
    return f"bool({value})" if not reading.nullable else f"(None if {value} is None else bool({value}))"


_GPU = Recipe(fields.GPU_READINGS)
_NIC = Recipe(fields.NIC_READINGS)
# The stored GPU readings an observation is made of: all the detector reads back (not every
# column: the dashboard-only ones, energy or encoder utilisation, cost it a read each).
GPU_READINGS = _GPU.columns


def gpu_obs(row: Mapping[str, Any], prev: Mapping[str, Any] | None, *, group: str, xids: tuple[int, ...] = ()) -> GpuObs:
    return GpuObs(row["ts"], row["cluster"], row["node"], row["uuid"], row["index"], row["model"], group, *_GPU.copy(row), xids,
                  row.get("workload_label"), row.get("workload_job"), *_GPU.derive(row, prev))


def nic_obs(row: Mapping[str, Any], prev: Mapping[str, Any] | None, *, group: str, node_busy: bool) -> NicObs:
    return NicObs(row["ts"], row["cluster"], row["node"], row["device"], row["port"], group, *_NIC.copy(row), *_NIC.derive(row, prev),
                  node_busy)
