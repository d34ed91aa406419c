"""Stored sample rows → observations: readings copied as stored, plus per-second rates and
increases from counter deltas against the same GPU's or port's previous sample. Which readings
are copied and which counters become which rate is agent/fields.py's (`detect`, `rate`, `delta`).

This runs for every GPU and port at every instant (half the detector's CPU once). A loop over
the table per row cost 60% more than the hand-written code it replaced, so, as dataclasses and
namedtuple do, the function that turns a row into its observation is generated from the table
once, at import, as the straight-line code a person would have written (`Recipe.source` shows
it): one call per row, the observation built in one go."""

from __future__ import annotations

from typing import Any

import msgspec

from agent import fields
from server.detect.model import GpuObs, NicObs, copied_readings, derived_names

# Byte counters that stand still while traffic flows may not have been refreshed yet: drivers
# that cannot read the hardware at every read serve a copy refreshed periodically (kernel
# Documentation/networking/statistics.rst). Still this long, a byte counter reads a real 0.
HELD_S = 30.0
SPAN_S = 4.0  # a byte counter's rate spans at least this much sample time (held_rate)
# Drivers refresh every second or two: a byte counter still for longer than this (and less than
# HELD_S) was not read afresh, or its port stopped: its rate is unknown, not its last one.
REFRESH_S = 2.5
NAMES_KEPT = 4096  # distinct names kept once (a port's state, a GPU model, a peer group)
_NAMES: dict[str, str] = {}


def canonical(text: str | None) -> str | None:
    """The one copy of this text the detector keeps: a database driver makes a new string for
    every row, and windows hold about twenty observations of every GPU and port, each with its
    names (a port's state, its device; a GPU's UUID, model and peer group: ~70 bytes each)."""
    kept = _NAMES.get(text)
    if kept is None and text is not None:
        if len(_NAMES) >= NAMES_KEPT:  # names come and go with jobs; dropping them only costs copies
            _NAMES.clear()
        kept = _NAMES[text] = text
    return kept


class Recipe:
    """How one table's rows become an observation at sample time `at`: `make(row, state, at,
    *extra)` calls `kind(*head, *copied readings, *middle, *rates and increases, *tail)`, where
    head, middle and tail are Python expressions over `row` and the extra arguments, with the
    rates and increases against `state.prev`, and leaves in `state.prev` what the next row needs
    of this one (its time, counters and steady readings, not the row: a whole row per GPU and
    port was a tenth of the detector's memory). A counter that decreased was reset (a driver
    reload, a reboot): no rate or increase across it; without a previous sample or with no time
    between the two, no rate.
    A byte counter that stands still keeps its last rate, up to HELD_S, and moving again its
    rate is taken over the time since it last moved (held_rate): a counter refreshed every
    second or two, read at 1 s, reads 0 then twice the traffic, which compared with peers is a
    port or link at 0.
    A rate of a counter that did not move is the one 0.0 of the code (error counters mostly do
    not: a float object of their own in every observation was another tenth). Rows normally
    carry every column (the detection source reads them all); one that lacks some is read with
    .get, on a slower path."""

    def __init__(self, name: str, kind: type, readings: tuple[fields.Reading, ...], *, extra: str,
                 head: str, middle: str = "", tail: str = "", steady: tuple[str, ...] = ()):
        copied = copied_readings(readings)
        counters = [r for r in readings if r.rate or r.delta]
        rates, deltas = derived_names(readings)
        d = {r.name: f"d{i}" for i, r in enumerate(counters)}
        b = {r.name: f"b{i}" for i, r in enumerate(counters)}
        # Steady readings (a power limit, a link rate): the previous row's value object when the
        # value is the same, so that the observations and past records of a GPU share one.
        v = {name: f"v{i}" for i, name in enumerate(steady)}
        rate_exprs, held_lines = [], []
        held = {rate: f"h{i}" for i, rate in enumerate(r for r in rates if _held(readings, r))}
        for rate in rates:
            parts = [d[r.name] for r in counters if r.rate == rate]
            moved = " or ".join(parts)
            unknown = " or ".join(f"{p} is None" for p in parts)
            if rate not in held:
                rate_exprs.append(f"None if dt <= 0 or {unknown} else (({' + '.join(parts)}) / dt if {moved} else 0.0)")
                continue
            h, r = held[rate], f"r{held[rate]}"
            now = [b[x.name] for x in counters if x.rate == rate]
            total = f"None if {' or '.join(f'{v} is None' for v in now)} else {' + '.join(now)}"
            # The usual sample inline (moved, its last move at least SPAN_S back, no real 0
            # before it: one interval's rate, as held_rate would give); the rest through it.
            held_lines.append([f"{h} = prev.{h}",
                               f"if dt > 0 and not ({unknown}) and ({moved}) and len({h}) > 2 and {h}[-2] <= at - SPAN_S "
                               f"and prev.ts - {h}[-2] < HELD_S:",
                               f"    {r} = ({' + '.join(parts)}) / (at - {h}[-2])",
                               f"    {h} = ({r}, {h}[-2], {h}[-1], at, {' + '.join(now)})",
                               "else:",
                               f"    {r}, {h} = held_rate({h}, at, prev.ts, {total}, {unknown}) if dt > 0 else (None, {h})"])
            rate_exprs.append(r)
        delta_exprs = [next(d[r.name] for r in counters if r.delta == delta) for delta in deltas]
        kept = [*((r.name, Any) for r in counters), *((n, Any) for n in steady), *((h, tuple) for h in held.values())]
        self.prev = msgspec.defstruct(f"{kind.__name__}Prev", [("ts", float), *kept], gc=False, module=__name__)

        def build(get, derived: list[str], shared: bool) -> str:
            values = [head, *(v[r.name] if shared and r.name in v else _copied(r, get) for r in copied), middle, *derived, tail]
            return f"kind({', '.join(x for x in values if x)})"

        def differences(get, indent: str) -> list[str]:
            out = [f"{indent}dt = at - prev.ts"]
            for r in counters:
                out += [f"{indent}a, {b[r.name]} = prev.{r.name}, {get('row', r.name)}",
                        f"{indent}{d[r.name]} = None if a is None or {b[r.name]} is None or {b[r.name]} < a else {b[r.name]} - a"]
            for name, var in v.items():
                out += [f"{indent}{var} = {get('row', name)}",
                        f"{indent}if {var} == prev.{name}:",
                        f"{indent}    {var} = prev.{name}"]
            return out + [indent + line for lines in held_lines for line in lines]

        def first_checkpoint(get, rate: str) -> str:
            now = [get("row", x.name) for x in counters if x.rate == rate]
            return f"((None,) if {' or '.join(f'{v} is None' for v in now)} else (None, at, {' + '.join(now)}))"

        def remember(get, fresh: bool) -> str:
            values = ["at", *(get("row", r.name) if fresh else b[r.name] for r in counters),
                      *(get("row", name) if fresh else var for name, var in v.items()),
                      *(first_checkpoint(get, rate) if fresh else h for rate, h in held.items())]
            return f"state.prev = Prev({', '.join(values)})"

        def item(obj: str, key: str) -> str:
            return f"{obj}[{key!r}]"

        def lookup(obj: str, key: str) -> str:
            return f"{obj}.get({key!r})"

        nothing = ["None"] * (len(rate_exprs) + len(delta_exprs))
        lines = [f"def {name}(row, state, {extra}):",
                 "    prev = state.prev",
                 "    if prev is None:",
                 f"        {remember(lookup, True)}",
                 f"        return {build(lookup, nothing, False)}",
                 "    try:",
                 *differences(item, " " * 8),
                 f"        {remember(item, False)}",
                 f"        return {build(item, rate_exprs + delta_exprs, True)}",
                 "    except KeyError:",  # a row without some column: the same, with .get
                 "        pass",
                 *differences(lookup, " " * 4),
                 f"    {remember(lookup, False)}",
                 f"    return {build(lookup, rate_exprs + delta_exprs, True)}"]
        self.source = "\n".join(lines)
        namespace: dict[str, Any] = {"kind": kind, "Prev": self.prev, "canonical": canonical, "held_rate": held_rate,
                                     "HELD_S": HELD_S, "SPAN_S": SPAN_S}
        exec(compile(self.source, f"<observe recipe: {name}>", "exec"), namespace)
        self.make = namespace[name]
        # What a reader of stored samples must fetch for these observations.
        self.columns = tuple(dict.fromkeys((*(r.name for r in copied), *(r.name for r in counters))))


def held_rate(h: tuple, at: float, prev_ts: float, total: int | None, unknown: bool) -> tuple[float | None, tuple]:
    """A byte counter's rate at `at`, and what the next sample needs: `h` is (the rate last
    measured, then (time, total) pairs, oldest first, of the samples where the counters moved).
    Still, the rate last measured (the counter not refreshed yet) for up to REFRESH_S, unknown
    after, and once they have stood still for HELD_S a real 0. Moving, the rate since the newest pair at least SPAN_S back (else
    the oldest): a refresh that lands just after a sample counts over several intervals, not
    all in one and none in the next."""
    if unknown or total is None or len(h) < 3:  # the first sample, a reset, or not read
        return None, ((None,) if total is None else (None, at, total))
    last_ts, last_total = h[-2], h[-1]
    if total == last_total:
        still = at - last_ts
        # The last rate while a refresh may still be due; then unknown: a read that returned the
        # previous value at 5 s (a stuck read, 10% of them) kept a rate from before a pause, a
        # port "moving 1.2 GB/s vs peer median 7.4" (31 false episodes an hour on 2-GPU nodes).
        return (h[0] if still <= REFRESH_S else None if still < HELD_S else 0.0), h
    pairs = h[1:] if prev_ts - last_ts < HELD_S else (prev_ts, last_total)  # else from the real 0
    i = len(pairs) - 2
    while i > 0 and pairs[i] > at - SPAN_S:
        i -= 2
    rate = (total - pairs[i + 1]) / (at - pairs[i])
    return rate, (rate, *pairs[i:], at, total)


def _held(readings: tuple[fields.Reading, ...], rate: str) -> bool:
    """A rate of byte counters: taken over the time since they last moved (Recipe)."""
    return all(r.unit == "bytes" for r in readings if r.rate == rate)


def _copied(reading: fields.Reading, get) -> str:
    value = get("row", reading.name)
    if reading.type is str:
        return f"canonical({value})"
    if reading.type is not bool:
        return value
    # Stored as 0/1 on SQLite.
    return f"bool({value})" if not reading.nullable else f"(None if {value} is None else bool({value}))"


_GPU = Recipe("gpu_obs", GpuObs, fields.GPU_READINGS, extra="at, cluster, node, group, uuid, model, xids=()",
              head='at, cluster, node, uuid, row["index"], model, group',
              middle='xids, row.get("workload_label"), row.get("workload_job")', steady=("power_limit_w", "sm_clock_max_mhz"))
_NIC = Recipe("nic_obs", NicObs, fields.NIC_READINGS, extra="at, cluster, node, group, device, node_busy",
              head='at, cluster, node, device, row["port"], group', tail="node_busy", steady=("rate_gbps",))
# The stored GPU readings an observation is made of: all the detector reads back (not every
# column: the dashboard-only ones, energy or encoder utilisation, cost it a read each).
GPU_READINGS = _GPU.columns
NIC_READINGS = _NIC.columns

# gpu_obs(row, state, at, cluster, node, group, uuid, model, xids=()) -> GpuObs (positional:
# keywords cost a tenth of the call); nic_obs(row, state, at, cluster, node, group, device,
# node_busy) -> NicObs. `state`: anything with a `prev` attribute, None before the first row
# (the engine's per GPU and port); `at`, the names: as the caller keeps them (the node instant's
# time, `canonical`), not each row's copy.
gpu_obs = _GPU.make
nic_obs = _NIC.make
GpuPrev, NicPrev = _GPU.prev, _NIC.prev
