"""xid, ecc and lost: one-off hardware events (immediate) and the lost condition."""

from __future__ import annotations

import pytest

from server.detect.model import HW_THERMAL
from server.detect.rules import ecc, lost, xid
from tests.detect.builders import CFG, Row, check_row, gpu, h100_peers, idle_gpu, one, series, tweak

PEERS = h100_peers()

ROWS = [
    # --- xid: must flag, immediately
    Row("XID 79 fallen off the bus", one(gpu(xids=(79,))), PEERS, "xid", "critical", immediate=True),
    Row("XID 48 double-bit ECC, counters not (yet) showing it", one(gpu(xids=(48,))), PEERS, "xid", "critical", immediate=True),
    Row("XID 74 NVLink error", one(gpu(xids=(74,))), PEERS, "xid", "critical", immediate=True),
    Row("XID 94 contained ECC error", one(gpu(xids=(94,))), PEERS, "xid", "critical", immediate=True),
    Row("XID 95 uncontained ECC error", one(gpu(xids=(95,))), PEERS, "xid", "critical", immediate=True),
    Row("realdata XID 119 GSP RPC timeout", one(gpu(xids=(119,))), PEERS, "xid", "critical", immediate=True),
    Row("hardware XID on an idle GPU", one(idle_gpu(xids=(79,))), PEERS, "xid", "critical", immediate=True),
    Row("hardware XID without peers", one(gpu(xids=(119,))), None, "xid", "critical", immediate=True),
    Row("application XID next to a hardware one", one(gpu(xids=(13, 79))), PEERS, "xid", "critical", immediate=True),
    # --- xid: must not flag
    Row("XID 13 graphics engine exception (application)", one(gpu(xids=(13,))), PEERS, None),
    Row("XID 31 memory page fault (application)", one(gpu(xids=(31,))), PEERS, None),
    Row("XID 43 GPU stopped processing (application)", one(gpu(xids=(43,))), PEERS, None),
    Row("application XIDs together", one(gpu(xids=(13, 31, 43))), PEERS, None),
    Row("unknown XID not in hardware_xids", one(gpu(xids=(999,))), PEERS, None),
    Row("hardware_xids setting narrowed", one(gpu(xids=(74,))), PEERS, None, cfg=tweak(hardware_xids=[79])),
    Row("hardware XID in an earlier sample only", series(3, at={0: {"xids": (79,)}}), PEERS, None),
    # --- ecc
    Row("one new uncorrected ECC error", one(gpu(ecc_uncorrected_new=1, ecc_uncorrected_total=1)), PEERS, "ecc", "critical", immediate=True),
    Row("new uncorrected error + XID 48 in the same sample: one cause, ecc", one(gpu(ecc_uncorrected_new=2, ecc_uncorrected_total=2, xids=(48,))),
        PEERS, "ecc", "critical", immediate=True),
    Row("rows pending remap: a condition, not immediate", one(gpu(remapped_rows_pending=True)), PEERS, "ecc", "critical"),
    Row("pending remap + XID 63 remap event: ecc", one(gpu(remapped_rows_pending=True, xids=(63,))), PEERS, "ecc", "critical"),
    Row("pending remap on an idle GPU", one(idle_gpu(remapped_rows_pending=True)), None, "ecc", "critical"),
    Row("old uncorrected total, nothing new", one(gpu(ecc_uncorrected_total=3, ecc_uncorrected_new=0)), PEERS, None),
    Row("first sample: increase unknown", one(gpu(ecc_uncorrected_total=3, ecc_uncorrected_new=None)), PEERS, None),
    Row("remap state unreadable", one(gpu(remapped_rows_pending=None)), PEERS, None),
    # --- lost
    Row("GPU reports lost (readings all None)", one(gpu(lost=True, util_gpu_pct=None, sm_clock_mhz=None, temp_c=None, clocks_event_reasons=None)),
        PEERS, "lost", "critical"),
    Row("lost with XID 79: one cause, lost", one(gpu(lost=True, util_gpu_pct=None, clocks_event_reasons=None, xids=(79,))), PEERS, "lost",
        "critical"),
    Row("lost GPU with stale thermal bits: lost only", one(gpu(lost=True, clocks_event_reasons=HW_THERMAL)), PEERS, "lost", "critical"),
]


@pytest.mark.parametrize("row", ROWS, ids=repr)
def test_event_table(row):
    check_row(row)


def test_xid_summary_names_the_meaning():
    f = xid.evaluate(one(gpu(xids=(13, 79))), PEERS, CFG)
    assert f.summary == "GPU 3 hardware XID 79 (GPU has fallen off the bus)"
    assert f.evidence["xids"] == [79] and f.evidence["other_xids"] == [13]


def test_ecc_summary_counts_and_says_what_to_do():
    f = ecc.evaluate(one(gpu(ecc_uncorrected_new=2, ecc_uncorrected_total=5, remapped_rows_pending=True, xids=(48,))), PEERS, CFG)
    assert f.summary == ("GPU 3 2 new uncorrected ECC errors (total 5); row remapping pending: reset the GPU to apply it; "
                         "XID 48 (double-bit ECC error)")
    assert f.immediate and f.evidence["xids"] == [48]


def test_lost_summary_carries_the_xid():
    f = lost.evaluate(one(gpu(lost=True, xids=(79,))), PEERS, CFG)
    assert "lost" in f.summary and "XID 79 (GPU has fallen off the bus)" in f.summary
    assert f.evidence["xids"] == [79] and not f.immediate
