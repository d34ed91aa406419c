"""network: an IB/RoCE port that is not ACTIVE, runs at a lower rate than its peers, shows
symbol/receive errors rising at a sustained rate or flapping, or — while its node's GPUs are
busy — moves far less than its peer ports, or waits to transmit far more than they do.

- State not ACTIVE (DOWN, POLLING, INIT, ARMED, ...): critical, whatever the node is doing.
  Nothing else is judged then: a down port's rate and throughput follow from it.
- Rate below what the port should run at (rates are discrete link speeds: 400 vs 200 Gb/s is a
  downtrained link or a bad cable): critical. "Should" is the rate of the same port (device
  and port number) on the other nodes of the group, so a storage NIC that runs at 200 Gb/s on
  every node is no fault next to 400 Gb/s compute rails; without namesakes, the peer median.
- Symbol + receive errors over rate_window_s of sample time ≥ ib_errors_in_window: a warning;
  an isolated symbol error is normal. The link going down and back up (link_downed rising)
  within rate_window_s: a warning (the port reads ACTIVE again, but the flap broke the
  connections using it).
- Throughput: the node busy, the busy peers' median at least ib_min_bps, this port ib_bw_drop
  below it and bw_z robust deviations under it: a warning. A quiet port on an idle node is
  fine, and the peer statistics only hold ports of busy nodes.
- Transmit-wait above ib_wait_factor × the peer median (and never below ib_wait_floor_per_s,
  so a quiet fabric with a median near 0 does not turn a trickle into an infinite ratio): a
  warning (congestion or credit starvation on this port's path).
"""

from __future__ import annotations

from server.detect.model import Finding, NicObs, NicPeerStats, Window
from server.detect.rules._common import THROUGHPUT_IN_ROW, at_least, gbps, increase, lead, new_in_window, pct, rnd, throughput_vs_peers
from server.detect.settings import DetectionSettings

CAUSE = "network"
ACTIVE_STATES = frozenset({"ACTIVE", "ACTIVE_DEFER"})
# Rates are parsed from text such as "400 Gb/sec": the tolerance only absorbs float noise.
RATE_TOLERANCE = 0.01


def port_label(obs: NicObs) -> str:
    return f"{obs.device} port {obs.port}"


def evaluate(window: Window, peers: NicPeerStats | None, cfg: DetectionSettings) -> Finding | None:
    obs = window.latest
    label = port_label(obs)
    base = {"node": obs.node, "device": obs.device, "port": obs.port, "state": obs.state, "rate_gbps": obs.rate_gbps, "node_busy": obs.node_busy}

    if obs.state is not None and obs.state.upper() not in ACTIVE_STATES:
        return Finding(cause=CAUSE, severity="critical", summary=f"{label} is {obs.state}, not ACTIVE",
                       evidence={**base, "metric": "state", "value": obs.state, "expected": "ACTIVE"})

    parts: list[str] = []
    evidence: dict = {}
    critical = False
    throughput = None

    expected, against = _expected_rate(obs, peers)
    if obs.rate_gbps is not None and expected is not None and obs.rate_gbps < expected * (1 - RATE_TOLERANCE):
        parts.append(f"link rate {obs.rate_gbps:g} Gb/s vs {against.format(rate=f'{expected:g} Gb/s')}")
        lead(evidence, "rate_gbps", obs.rate_gbps, peer_median=expected, deviation=rnd(obs.rate_gbps / expected - 1))
        evidence.update(peer_rate_gbps=expected)
        critical = True

    symbol = increase(window, "symbol_errors_per_s", cfg.rate_window_s)
    rcv = increase(window, "rcv_errors_per_s", cfg.rate_window_s)
    if at_least(symbol + rcv, cfg.ib_errors_in_window):
        parts.append(f"{round(symbol + rcv)} link errors in {cfg.rate_window_s:.0f} s (symbol {round(symbol)}, receive {round(rcv)})")
        lead(evidence, "errors_in_window", round(symbol + rcv))
        evidence.update(symbol_errors_in_window=round(symbol, 1), rcv_errors_in_window=round(rcv, 1), window_s=cfg.rate_window_s)

    downed = new_in_window(window, "link_downed_new", cfg.rate_window_s)
    if downed > 0:
        parts.append(f"link went down {downed}× in {cfg.rate_window_s:.0f} s")
        lead(evidence, "link_downed_in_window", downed)
        evidence.update(link_downed_in_window=downed, window_s=cfg.rate_window_s)

    if peers is not None and obs.node_busy:
        bw = throughput_vs_peers(obs.bps, peers.bps, min_median=cfg.ib_min_bps, drop=cfg.ib_bw_drop, cfg=cfg)
        if bw is not None and bw.low:
            throughput = f"moving {gbps(bw.value)} vs peer median {gbps(bw.peer_median)} ({pct(bw.deviation)}) while the node is busy"
            parts.append(throughput)
            lead(evidence, "bps", bw.value, peer_median=bw.peer_median, deviation=rnd(bw.deviation))
            evidence.update(bps=bw.value, peer_bps=bw.peer_median, bps_z=rnd(bw.z, 2))

    wait = _sustained_wait(window, cfg.rate_window_s)
    if peers is not None and peers.xmit_wait_per_s is not None and wait is not None:
        median = peers.xmit_wait_per_s.median
        if wait > cfg.ib_wait_factor * max(median, cfg.ib_wait_floor_per_s):
            factor = wait / median if median > 0 else None
            ratio = f"{factor:.0f}× " if factor is not None else ""
            parts.append(f"transmit-wait {wait:.3g} ticks/s, {ratio}the peer median {median:.3g}")
            lead(evidence, "xmit_wait_per_s", wait, peer_median=median)
            evidence.update(xmit_wait_per_s=wait, peer_xmit_wait_per_s=median, wait_factor=rnd(factor, 1))

    if not parts:
        return None
    return Finding(cause=CAUSE, severity="critical" if critical else "warning", summary=f"{label} " + "; ".join(parts),
                   evidence={k: v for k, v in {**base, **evidence}.items() if v is not None},
                   in_row=THROUGHPUT_IN_ROW if parts == [throughput] else 1)


def _expected_rate(obs: NicObs, peers: NicPeerStats | None) -> tuple[float | None, str]:
    """What the port should run at: its namesakes on the other nodes of its group (a port is
    compared with ports of its own role), else the median of its peers."""
    if obs.expected_rate_gbps is not None:
        return obs.expected_rate_gbps, f"{{rate}} on {obs.device} port {obs.port} of the other nodes"
    if peers is not None and peers.rate_gbps is not None:
        return peers.rate_gbps.median, "peer median {rate}"
    return None, ""


def _sustained_wait(window, seconds: float) -> float | None:
    """The larger of this instant's transmit-wait rate and its mean over the window: congestion
    that bites only in communication phases stays one condition instead of flapping with them."""
    now = window.latest.xmit_wait_per_s
    rates = [o.xmit_wait_per_s for o in window.since(seconds) if o.xmit_wait_per_s is not None]
    if now is None:
        return None
    return max(now, sum(rates) / len(rates))
