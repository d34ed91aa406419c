"""When a hint holds: from its first episode's onset until the last episode has resolved AND the
cool-down has passed, all in the cluster's SAMPLE time.

"Now" is the newest sample time the collector has stored for the cluster (the latest
`nodes.last_seen`), not the wall clock: a replayed trace clears hints exactly when live data
would have, and a collector that was down for an hour does not clear everything on restart
before the agents' new samples arrive. (Episodes' onset and resolved_at are sample times too.)

An episode is *live* while it is open or resolved less than `cooldown_s` ago. Episodes of one
GPU (or node-level entity) whose live spans [onset, resolved_at + cooldown_s] overlap or touch
form one hint: a GPU that flaps keeps one hint with one `since`, the onset of the first.

An episode marked `held` (remedy.py: a hardware fault whose remedy has not been seen) is live
however long ago it resolved."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


def live_until(episode: Mapping[str, Any], cooldown_s: float) -> float:
    """Sample time at which the episode stops holding its hint (inf while open or held)."""
    resolved = episode.get("resolved_at")
    return math.inf if resolved is None or episode.get("held") else float(resolved) + cooldown_s


def is_live(episode: Mapping[str, Any], now: float, cooldown_s: float) -> bool:
    return live_until(episode, cooldown_s) > now


@dataclass(frozen=True)
class Chain:
    since: float  # onset of the first episode of the run that is live now
    live: list[dict[str, Any]]  # the episodes holding the hint now, oldest onset first
    clears_at: float  # sample time the hint clears if nothing new happens (inf while any is open)


def current_chain(episodes: Iterable[Mapping[str, Any]], now: float, cooldown_s: float) -> Chain | None:
    """The run of overlapping live spans that reaches `now`, or None when the entity is clear."""
    ordered = sorted(episodes, key=lambda e: (float(e["onset"]), e.get("id") or 0))
    live = [dict(e) for e in ordered if is_live(e, now, cooldown_s)]
    if not live:
        return None
    # Walk the spans in onset order, merging; the run containing the live ones is the last.
    since: float | None = None
    reach = -math.inf
    for ep in ordered:
        onset = float(ep["onset"])
        if onset > now:  # an episode stamped after the newest sample: count it as now
            onset = now
        if since is None or onset > reach:
            since = onset
        reach = max(reach, live_until(ep, cooldown_s))
    return Chain(since=float(since), live=live, clears_at=max(live_until(e, cooldown_s) for e in live))
