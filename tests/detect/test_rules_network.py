"""network: IB/RoCE port not ACTIVE, rate below peers, errors rising or flapping, throughput far
below or transmit-wait far above peer ports."""

from __future__ import annotations

import pytest

from server.detect.model import NicPeerStats, Robust
from server.detect.rules import network
from tests.detect.builders import CFG, Row, check_row, judge_nic, nic, nic_peers, one, series, tweak

PEERS = nic_peers()  # 400 Gb/s, 20 GB/s median, transmit-wait 2e5 ticks/s
SYM, RCV = "symbol_errors_per_s", "rcv_errors_per_s"


def nic_series(n=7, **kw):
    return series(n, make=nic, **kw)


ROWS = [
    # --- state
    Row("port DOWN", one(nic(state="DOWN", rate_gbps=None, bps=0.0)), PEERS, "network", "critical"),
    Row("port POLLING on an idle node", one(nic(state="POLLING", node_busy=False)), None, "network", "critical"),
    Row("port INIT (no subnet manager)", one(nic(state="INIT")), PEERS, "network", "critical"),
    Row("ACTIVE_DEFER counts as active", one(nic(state="ACTIVE_DEFER")), PEERS, None),
    Row("state unknown", one(nic(state=None)), PEERS, None),
    # --- rate
    Row("rate 200 of peers' 400 Gb/s", one(nic(rate_gbps=200.0)), PEERS, "network", "critical"),
    Row("rate 200 Gb/s on an idle node", one(nic(rate_gbps=200.0, node_busy=False, bps=0.0)), PEERS, "network", "critical"),
    Row("rate below peers but no peers to compare with", one(nic(rate_gbps=200.0)), None, None),
    Row("rate above peers", one(nic(rate_gbps=800.0)), PEERS, None),
    # --- errors and flaps over rate_window_s
    Row("symbol errors: 5 in 60 s", nic_series(counts={SYM: [1, 1, 1, 1, 1, 0]}), PEERS, "network", "warning"),
    Row("symbol + receive errors add up to 6", nic_series(counts={SYM: [1, 2], RCV: [1, 2]}), PEERS, "network", "warning"),
    Row("errors rising on an idle node", nic_series(node_busy=False, counts={RCV: [3, 3]}), None, "network", "warning"),
    Row("4 symbol errors in 60 s", nic_series(counts={SYM: [1, 1, 1, 1, 0, 0]}), PEERS, None),
    Row("an isolated symbol error", nic_series(counts={SYM: [0, 1, 0, 0, 0, 0]}), PEERS, None),
    Row("errors older than the window", nic_series(13, counts={SYM: [9] + [0] * 11}), PEERS, None),
    Row("ib_errors_in_window raised to 20", nic_series(counts={SYM: [2, 2, 2, 2, 2, 2]}), PEERS, None, cfg=tweak(ib_errors_in_window=20)),
    Row("link went down and back up 20 s ago", nic_series(at={-2: {"link_downed_new": 1}}), PEERS, "network", "warning"),
    Row("link flap 2 minutes ago", nic_series(13, at={1: {"link_downed_new": 1}}), PEERS, None),
    # --- throughput vs busy peer ports
    Row("busy node, port at 10 GB/s vs 20 GB/s", one(nic(bps=10e9)), PEERS, "network", "warning"),
    Row("busy node, port 25% below peers", one(nic(bps=15e9)), PEERS, None),
    Row("quiet port on an idle node", one(nic(bps=1e6, node_busy=False)), PEERS, None),
    Row("whole group quiet (a compute phase)", one(nic(bps=1e6)), nic_peers(bps_scale=1e-4), None),
    Row("whole group's traffic halves together", one(nic(bps=10e9)), nic_peers(bps_scale=0.5), None),
    Row("port 40% below a widely spread group", one(nic(bps=12e9)), NicPeerStats("g", 8, bps=Robust(20e9, 6e9, 8)), None),
    Row("no peer stats", one(nic(bps=1e9)), None, None),
    # --- transmit-wait vs peers
    Row("transmit-wait 4.8× the peer median (under ib_wait_factor)", one(nic(xmit_wait_per_s=9.6e6)), nic_peers(wait_scale=10), None),
    Row("transmit-wait 5.2× the peer median", one(nic(xmit_wait_per_s=1.04e7)), nic_peers(wait_scale=10), "network", "warning"),
    Row("transmit-wait 30× the peer median", one(nic(xmit_wait_per_s=6e7)), nic_peers(wait_scale=10), "network", "warning"),
    Row("transmit-wait high, peers at 0: floor decides (1.2e6 > 5 × 2e5)", one(nic(xmit_wait_per_s=1.2e6)), nic_peers(wait_scale=0),
        "network", "warning"),
    Row("transmit-wait trickle, peers at 0 (8e5 < 5 × 2e5 floor)", one(nic(xmit_wait_per_s=8e5)), nic_peers(wait_scale=0), None),
    Row("whole fabric congested together", one(nic(xmit_wait_per_s=5e7)), nic_peers(wait_scale=250), None),
    Row("healthy port", one(nic()), PEERS, None),
    # --- the rate a port should run at: its namesakes on the other nodes
    Row("downtrained since boot: 200 Gb/s where the other nodes' mlx5_0 run 400, no peers of its role",
        one(nic(rate_gbps=200.0, expected_rate_gbps=400.0)), None, "network", "critical"),
    Row("a storage NIC at 200 Gb/s like its namesakes, next to 400 Gb/s rails", one(nic(rate_gbps=200.0, expected_rate_gbps=200.0)),
        PEERS, None),
]


@pytest.mark.parametrize("row", ROWS, ids=repr)
def test_network_table(row):
    check_row(row, judge=judge_nic)


def test_down_port_says_only_that():
    f = network.evaluate(nic_series(state="DOWN", bps=0.0, counts={SYM: [9, 9]}), PEERS, CFG)
    assert f.summary == "mlx5_0 port 1 is DOWN, not ACTIVE"
    assert (f.evidence["metric"], f.evidence["value"], f.evidence["node"]) == ("state", "DOWN", "node-a")


def test_summary_combines_rate_errors_and_throughput():
    f = network.evaluate(nic_series(rate_gbps=200.0, bps=8e9, counts={SYM: [3, 3]}), PEERS, CFG)
    assert f.severity == "critical"
    assert f.summary == ("mlx5_0 port 1 link rate 200 Gb/s vs peer median 400 Gb/s; 6 link errors in 60 s (symbol 6, receive 0); "
                         "moving 8 GB/s vs peer median 20 GB/s (-60%) while the node is busy")
    assert (f.evidence["metric"], f.evidence["value"], f.evidence["peer_median"]) == ("rate_gbps", 200.0, 400.0)


def test_a_throughput_figure_alone_asks_for_two_hits_in_a_row():
    assert network.evaluate(one(nic(bps=8e9)), PEERS, CFG).in_row == 2
    assert network.evaluate(nic_series(rate_gbps=200.0, bps=8e9, counts={SYM: [3, 3]}), PEERS, CFG).in_row == 1
    assert network.evaluate(one(nic(bps=8e9, xmit_wait_per_s=6e7)), nic_peers(wait_scale=10), CFG).in_row == 1


def test_transmit_wait_summary():
    f = network.evaluate(one(nic(xmit_wait_per_s=6e7)), nic_peers(wait_scale=10), CFG)
    assert f.summary == "mlx5_0 port 1 transmit-wait 6e+07 ticks/s, 30× the peer median 2e+06"
    assert f.evidence["wait_factor"] == 30.0
