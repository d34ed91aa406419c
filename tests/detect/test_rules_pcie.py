"""pcie: link below its max generation (while busy) or width, replays rising at a sustained rate."""

from __future__ import annotations

import pytest

from server.detect.rules import pcie
from tests.detect.builders import CFG, Row, check_row, gpu, h100_peers, idle_gpu, one, series, tweak

PEERS = h100_peers()
REPLAY = "pcie_replay_per_s"

ROWS = [
    # --- link below max
    Row("busy GPU at Gen4 of Gen5", one(gpu(pcie_gen=4)), PEERS, "pcie", "critical"),
    Row("width x8 of x16 while busy", one(gpu(pcie_width=8)), PEERS, "pcie", "critical"),
    Row("width x8 of x16 while idle (lanes are not dropped to save power)", one(idle_gpu(pcie_width=8)), PEERS, "pcie", "critical"),
    Row("busy, Gen4 without peers", one(gpu(pcie_gen=4)), None, "pcie", "critical"),
    Row("realdata: idle RTX 4090 stepped down to Gen1 of Gen4 (power saving)", one(idle_gpu(pcie_gen=1, pcie_gen_max=4)), PEERS, None),
    Row("idle H100 at Gen3 of Gen5", one(idle_gpu(pcie_gen=3)), PEERS, None),
    Row("0% utilisation without the Idle bit, Gen1", one(gpu(util_gpu_pct=0, pcie_gen=1)), PEERS, None),
    Row("link readings unknown", one(gpu(pcie_gen=None, pcie_width=None)), PEERS, None),
    # --- replays over rate_window_s
    Row("5 replays in the last 60 s", series(7, counts={REPLAY: [1, 1, 1, 1, 1, 0]}), PEERS, "pcie", "warning"),
    Row("replays rising steadily", series(7, counts={REPLAY: [3, 3, 3, 3, 3, 3]}), PEERS, "pcie", "warning"),
    Row("replays rising on an idle GPU", series(7, make=idle_gpu, counts={REPLAY: [2, 2, 2]}), PEERS, "pcie", "warning"),
    Row("4 replays in 60 s", series(7, counts={REPLAY: [1, 1, 1, 1, 0, 0]}), PEERS, None),
    Row("an isolated replay", series(7, counts={REPLAY: [0, 0, 0, 1, 0, 0]}), PEERS, None),
    Row("realdata: 43-120 replays since reset, none lately (totals are not judged)", series(7, counts={REPLAY: [0] * 6}), PEERS, None),
    Row("replays older than the window", series(13, counts={REPLAY: [5, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]}), PEERS, None),
    Row("one sample, rate known but interval unknown: not counted", one(gpu(pcie_replay_per_s=10.0)), PEERS, None),
    Row("pcie_replays_in_window lowered to 1 makes one replay count", series(7, counts={REPLAY: [0, 0, 0, 1, 0, 0]}), PEERS,
        "pcie", "warning", cfg=tweak(pcie_replays_in_window=1)),
    Row("width x8 and replays rising: one finding, critical", series(7, pcie_width=8, counts={REPLAY: [2, 2, 2]}), PEERS, "pcie", "critical"),
]


@pytest.mark.parametrize("row", ROWS, ids=repr)
def test_pcie_table(row):
    check_row(row)


def test_summary_and_evidence():
    f = pcie.evaluate(series(7, pcie_gen=4, pcie_width=8, counts={REPLAY: [4, 4, 4]}), PEERS, CFG)
    assert f.summary == "GPU 3 PCIe link Gen4 x8, max Gen5 x16; 12 PCIe replays in 60 s"
    assert (f.evidence["metric"], f.evidence["value"], f.evidence["expected"]) == ("pcie_width", 8, 16)
    assert f.evidence["replays_in_window"] == 12.0


def test_samples_of_uneven_spacing_count_their_own_intervals():
    # 30 s gap then 10 s samples: the rates times their own intervals give the increase.
    from tests.detect.builders import T0, window

    items = [gpu(ts=T0), gpu(ts=T0 + 30, pcie_replay_per_s=2 / 30), gpu(ts=T0 + 40, pcie_replay_per_s=0.3)]
    assert pcie.evaluate(window(*items), PEERS, CFG) is not None  # 2 + 3 = 5
    items[-1] = gpu(ts=T0 + 40, pcie_replay_per_s=0.2)
    assert pcie.evaluate(window(*items), PEERS, CFG) is None  # 2 + 2 = 4
