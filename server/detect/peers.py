"""Robust statistics of a peer group at one instant: median and MAD over its busy members."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from statistics import median

from server.detect.model import GpuObs, NicObs, NicPeerStats, PeerStats, Robust


def robust(values: Sequence[float]) -> Robust | None:
    if not values:
        return None
    m = median(values)
    return Robust(median=m, mad=median([abs(v - m) for v in values]), n=len(values))


def _collect(items: Iterable, get: Callable) -> list[float]:
    return [v for v in map(get, items) if v is not None]


def gpu_peer_stats(group: str, members: Sequence[GpuObs], *, min_peers: int) -> PeerStats | None:
    busy = [o for o in members if o.busy and not o.lost]
    if len(busy) < min_peers:
        return None
    return PeerStats(
        group=group,
        size=len(busy),
        sm_clock_ratio=robust(_collect(busy, lambda o: o.sm_clock_ratio)),
        sm_clock_max_mhz=robust(_collect(busy, lambda o: o.sm_clock_max_mhz)),
        temp_c=robust(_collect(busy, lambda o: o.temp_c)),
        power_w=robust(_collect(busy, lambda o: o.power_w)),
        power_limit_w=robust(_collect(busy, lambda o: o.power_limit_w)),
        nvlink_bps=robust(_collect(busy, lambda o: o.nvlink_bps)),
    )


def nic_peer_stats(group: str, members: Sequence[NicObs], *, min_peers: int) -> NicPeerStats | None:
    # Ports of busy nodes only: an idle node's quiet port says nothing about the others.
    busy = [o for o in members if o.node_busy]
    if len(busy) < min_peers:
        return None
    return NicPeerStats(
        group=group,
        size=len(busy),
        rate_gbps=robust(_collect(busy, lambda o: o.rate_gbps)),
        bps=robust(_collect(busy, lambda o: o.bps)),
        xmit_wait_per_s=robust(_collect(busy, lambda o: o.xmit_wait_per_s)),
    )
