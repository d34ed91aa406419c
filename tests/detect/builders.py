"""Small builders for the rule tests: a healthy busy H100, the peer statistics of a group of
8 healthy H100s, windows of N instants with counters rising at given rates, and the same for
IB ports. Numbers follow the real dumps in /work/shared/realdata where they exist (H100 max SM
clock 1980 MHz and 700 W limit; idle H100 at 345 MHz with the Idle bit, ~70 W)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from server.detect import rules
from server.detect.model import IDLE, Finding, GpuObs, NicObs, NicPeerStats, PeerStats, Window
from server.detect.peers import gpu_peer_stats, nic_peer_stats
from server.detect.settings import DetectionSettings

H100 = "NVIDIA H100 80GB HBM3"
T0 = 1_000_000.0
STEP = 10.0  # seconds between samples
CFG = DetectionSettings()

# --- GPUs -----------------------------------------------------------------------------------


def gpu(**kw: Any) -> GpuObs:
    """A healthy, busy H100 in the middle of its group."""
    base: dict[str, Any] = dict(
        ts=T0, cluster="c1", node="node-a", uuid="GPU-a-3", index=3, model=H100, group=f"c1|{H100}|job-1",
        util_gpu_pct=98.0, sm_clock_mhz=1980.0, sm_clock_max_mhz=1980.0, temp_c=66.0, power_w=660.0,
        power_limit_w=700.0, clocks_event_reasons=0, pcie_gen=5, pcie_gen_max=5, pcie_width=16, pcie_width_max=16,
        nvlink_links_up=18, nvlink_links_total=18, ecc_uncorrected_total=0, remapped_rows_pending=False,
        nvlink_bps=150e9, nvlink_crc_per_s=0.0, nvlink_replay_per_s=0.0, nvlink_recovery_per_s=0.0,
        pcie_replay_per_s=0.0, ecc_uncorrected_new=0,
    )
    base.update(kw)
    return GpuObs(**base)


def idle_gpu(**kw: Any) -> GpuObs:
    """An idle H100 as in realdata gpud 535.183.01: Idle bit, 0 %, 345 MHz, ~70 W, 36 °C."""
    base: dict[str, Any] = dict(util_gpu_pct=0.0, sm_clock_mhz=345.0, power_w=70.0, temp_c=36.0, clocks_event_reasons=IDLE, nvlink_bps=0.0)
    base.update(kw)
    return gpu(**base)


# A realistic spread for 8 healthy busy H100s (the gpu-burn A100 node spreads 1.7 % in Gflop/s
# and a few °C): clocks within 1.5 %, temperatures 62-70 °C, NVLink within ±2 %.
_CLOCKS = (1980, 1980, 1965, 1980, 1950, 1980, 1980, 1970)
_TEMPS = (62, 64, 65, 66, 66, 67, 68, 70)
_POWER = (640, 655, 660, 662, 668, 670, 675, 690)
_NVLINK = (148e9, 150e9, 151e9, 149e9, 150e9, 152e9, 150e9, 147e9)


def group(n: int = 8, *, clock_scale: float = 1.0, temp_shift: float = 0.0, nvlink_scale: float = 1.0,
          **kw: Any) -> list[GpuObs]:
    """n healthy busy H100s; the scale/shift arguments move the whole group together."""
    members = []
    for i in range(n):
        j = i % len(_CLOCKS)
        fields = dict(index=i, uuid=f"GPU-peer-{i}", sm_clock_mhz=_CLOCKS[j] * clock_scale, temp_c=_TEMPS[j] + temp_shift,
                      power_w=_POWER[j], nvlink_bps=_NVLINK[j] * nvlink_scale)
        fields.update(kw)
        members.append(gpu(**fields))
    return members


def peers_of(members: Sequence[GpuObs], cfg: DetectionSettings = CFG) -> PeerStats | None:
    """The engine's own peer statistics (busy members only; None below min_peers)."""
    return gpu_peer_stats(members[0].group, members, min_peers=cfg.min_peers)


def h100_peers(**kw: Any) -> PeerStats:
    stats = peers_of(group(**kw))
    assert stats is not None
    return stats


# --- windows --------------------------------------------------------------------------------


def window(*items: Any) -> Window:
    return Window(recent=list(items[-120:]))


def series(n: int = 7, *, make: Callable[..., Any] = gpu, step: float = STEP, counts: dict[str, Sequence[float]] | None = None,
           at: dict[int, dict[str, Any]] | None = None, **fields: Any) -> Window:
    """n instants `step` s apart, the last one judged. `counts` maps a per-second rate field to
    the counter increase of each interval (aligned to the end: the last number is the interval
    ending at the latest sample); `at` overrides fields at given instants (negative = from end)."""
    items = []
    for i in range(n):
        kw = dict(fields, ts=T0 + i * step)
        for attr, seq in (counts or {}).items():
            j = i - (n - len(seq))
            if j >= 0:
                kw[attr] = seq[j] / step
        for idx, over in (at or {}).items():
            if idx % n == i:
                kw.update(over)
        items.append(make(**kw))
    return window(*items)


def one(obs: Any) -> Window:
    return window(obs)


# --- IB ports -------------------------------------------------------------------------------


def nic(**kw: Any) -> NicObs:
    """A healthy NDR port on a busy node, moving 20 GB/s with a little transmit-wait."""
    base: dict[str, Any] = dict(
        ts=T0, cluster="c1", node="node-a", device="mlx5_0", port=1, group="c1|nic|job-1", state="ACTIVE",
        rate_gbps=400.0, bps=20e9, symbol_errors_per_s=0.0, rcv_errors_per_s=0.0, link_downed_new=0,
        xmit_wait_per_s=2e5, node_busy=True,
    )
    base.update(kw)
    return NicObs(**base)


_NIC_BPS = (19.5e9, 20e9, 20.4e9, 19.8e9, 20.1e9, 20.0e9, 19.7e9, 20.3e9)
_NIC_WAIT = (1.5e5, 2e5, 2.5e5, 1.8e5, 2.2e5, 2e5, 1.9e5, 2.1e5)


def nic_group(n: int = 8, *, bps_scale: float = 1.0, wait_scale: float = 1.0, **kw: Any) -> list[NicObs]:
    members = []
    for i in range(n):
        j = i % len(_NIC_BPS)
        fields = dict(node=f"node-{i}", bps=_NIC_BPS[j] * bps_scale, xmit_wait_per_s=_NIC_WAIT[j] * wait_scale)
        fields.update(kw)
        members.append(nic(**fields))
    return members


def nic_peers(**kw: Any) -> NicPeerStats:
    members = nic_group(**kw)
    stats = nic_peer_stats(members[0].group, members, min_peers=CFG.min_peers)
    assert stats is not None
    return stats


# --- running the rules ----------------------------------------------------------------------


@dataclass
class Row:
    """One table row: what the rules see, and the one cause (or None) they must report."""

    desc: str
    window: Window
    peers: Any
    cause: str | None
    severity: str | None = None
    cfg: DetectionSettings = field(default_factory=lambda: CFG)
    immediate: bool = False

    def __repr__(self) -> str:  # pytest ids
        return self.desc


def judge_gpu(win: Window, peers: PeerStats | None, cfg: DetectionSettings = CFG) -> list[Finding]:
    """Every GPU rule on one instant, as the engine runs them."""
    return [f for rule in rules.GPU_RULES if (f := rule(win, peers, cfg)) is not None]


def judge_nic(win: Window, peers: NicPeerStats | None, cfg: DetectionSettings = CFG) -> list[Finding]:
    return [f for rule in rules.NIC_RULES if (f := rule(win, peers, cfg)) is not None]


def check_row(row: Row, judge: Callable[..., list[Finding]] = judge_gpu) -> Finding | None:
    """Exactly the expected cause, with its severity — or nothing at all."""
    found = judge(row.window, row.peers, row.cfg)
    causes = [f.cause for f in found]
    if row.cause is None:
        assert causes == [], f"{row.desc}: expected nothing, got {[(f.cause, f.summary) for f in found]}"
        return None
    assert causes == [row.cause], f"{row.desc}: expected only {row.cause}, got {[(f.cause, f.summary) for f in found]}"
    finding = found[0]
    assert finding.severity == row.severity, f"{row.desc}: severity {finding.severity}, expected {row.severity}: {finding.summary}"
    assert finding.immediate == row.immediate, f"{row.desc}: immediate={finding.immediate}"
    assert finding.summary and "\n" not in finding.summary
    assert any(ch.isdigit() for ch in finding.summary), f"{row.desc}: summary carries no numbers: {finding.summary}"
    assert "metric" in finding.evidence and "value" in finding.evidence, finding.evidence
    return finding


def tweak(cfg: DetectionSettings = CFG, **kw: Any) -> DetectionSettings:
    return cfg.model_copy(update=kw)


__all__ = [
    "CFG", "H100", "STEP", "T0", "Row", "check_row", "group", "gpu", "h100_peers", "idle_gpu", "judge_gpu", "judge_nic",
    "nic", "nic_group", "nic_peers", "one", "peers_of", "replace", "series", "tweak", "window",
]
