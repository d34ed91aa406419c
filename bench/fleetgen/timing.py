"""When each node samples and when its batches reach the collector.

A real fleet's agents start at different instants and their timers drift and stall: every
node samples on its own phase, each tick a little early or late, now and then one much later.
Each batch is pushed once its last sample is taken, after a short delay; an agent that cannot
reach the collector keeps sampling into its spool and replays it, oldest first, when it can."""

from __future__ import annotations

from random import Random

JITTER = 0.01  # sigma of a tick's jitter, × interval
JITTER_MAX = 0.1  # clipped here, × interval
LATE_TICK_P = 1 / 200  # a stalled timer (GC pause, busy host): this much later
LATE_TICK_MAX = 0.25
SEND_DELAY_MAX = 2.0  # seconds from a batch's last sample to its push
REPLAY_GAP = (0.02, 0.2)  # seconds between two replayed batches


def sample_times(t0: float, interval: float, steps: int, *, sync: bool, rng: Random) -> tuple[float, list[float]]:
    """(phase, the node's `steps` sample times). sync: everyone on t0 + k × interval."""
    if sync:
        return 0.0, [t0 + k * interval for k in range(steps)]
    phase = rng.uniform(0.0, interval)
    times = []
    last = t0 - 1.0
    for k in range(steps):
        if rng.random() < LATE_TICK_P:
            j = rng.uniform(JITTER_MAX, LATE_TICK_MAX)
        else:
            j = max(-JITTER_MAX, min(JITTER_MAX, rng.gauss(0.0, JITTER)))
        ts = round(max(t0, t0 + phase + (k + j) * interval), 3)
        ts = max(ts, round(last + 0.001, 3))  # strictly increasing, whatever the interval
        times.append(ts)
        last = ts
    return phase, times


def send_plan(times: list[float], first: int, per_batch: int, *, sync: bool, outage: tuple[float, float] | None,
              rng: Random) -> list[tuple[int, int, float]]:
    """(k0, k1, send time) of each batch of the node's samples k0..k1-1, from its first sample
    on. Batches follow the fleet's common boundaries (multiples of `per_batch`), so a node
    joining late starts with a short one. sync: sent as the batch's last grid sample is taken,
    every node at once. `outage`: absolute times in which the node cannot push."""
    plan = []
    last = float("-inf")
    for k0 in range(0, len(times), per_batch):
        k1 = min(len(times), k0 + per_batch)
        k0 = max(k0, first)
        if k0 >= k1:
            continue
        if sync:
            plan.append((k0, k1, times[k1 - 1]))
            continue
        send = times[k1 - 1] + rng.uniform(0.0, SEND_DELAY_MAX)
        if outage is not None and outage[0] <= send < outage[1]:
            send = outage[1] + rng.uniform(0.0, SEND_DELAY_MAX)  # spooled
        # One push after the other: a replay or a slow push holds the next batch back.
        send = round(max(send, last + rng.uniform(*REPLAY_GAP)), 3)
        plan.append((k0, k1, send))
        last = send
    return plan
