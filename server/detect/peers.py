"""Robust statistics of a peer group at one instant: median and MAD over its busy members
(each worked out when first read: model.Robust)."""

from __future__ import annotations

from collections.abc import Sequence

from server.detect.model import SW_POWER_CAP, GpuObs, NicObs, NicPeerStats, PeerStats, Robust


def _present(values) -> list:
    return [v for v in values if v is not None]


def gpu_peer_stats(group: str, members: Sequence[GpuObs], *, min_peers: int) -> PeerStats | None:
    busy = [o for o in members if o.busy and not o.lost]
    if len(busy) < min_peers:
        return None
    return PeerStats(
        group=group,
        size=len(busy),
        sm_clock_ratio=Robust.of(_present([o.sm_clock_ratio for o in busy])),
        sm_clock_max_mhz=Robust.of(_present([o.sm_clock_max_mhz for o in busy])),
        temp_c=Robust.of(_present([o.temp_c for o in busy])),
        power_w=Robust.of(_present([o.power_w for o in busy])),
        power_limit_w=Robust.of(_present([o.power_limit_w for o in busy])),
        nvlink_bps=Robust.of(_present([o.nvlink_bps for o in busy])),
        power_capped=sum(1 for o in busy if o.reasons & SW_POWER_CAP) / len(busy),
    )


def nic_peer_stats(group: str, members: Sequence[NicObs], *, min_peers: int) -> NicPeerStats | None:
    # Ports of busy nodes only: an idle node's quiet port says nothing about the others.
    busy = [o for o in members if o.node_busy]
    if len(busy) < min_peers:
        return None
    return NicPeerStats(
        group=group,
        size=len(busy),
        rate_gbps=Robust.of(_present([o.rate_gbps for o in busy])),
        bps=Robust.of(_present([o.bps for o in busy])),
        xmit_wait_per_s=Robust.of(_present([o.xmit_wait_per_s for o in busy])),
    )
