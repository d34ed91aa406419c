"""ecc: new uncorrected ECC errors, or rows waiting to be remapped at the next GPU reset.

- ecc_uncorrected_new > 0 (the counter rose since the previous sample): a one-off event,
  critical and immediate. A total that stays where it was never flags again.
- remapped_rows_pending: a lasting condition until the GPU is reset; critical, judged with
  persistence like any condition.
ECC-class XIDs in the same sample are reported here (the xid rule hands them over).
"""

from __future__ import annotations

from server.detect.model import Finding, PeerStats, Window
from server.detect.rules._common import gpu_label
from server.detect.rules.xid import ECC_XIDS, describe, hardware_xids
from server.detect.settings import DetectionSettings

CAUSE = "ecc"


def evaluate(window: Window, peers: PeerStats | None, cfg: DetectionSettings) -> Finding | None:
    obs = window.latest
    if obs.lost:
        return None
    new = obs.ecc_uncorrected_new or 0
    pending = bool(obs.remapped_rows_pending)
    if new <= 0 and not pending:
        return None
    parts = []
    if new > 0:
        parts.append(f"{new} new uncorrected ECC error{'s' if new != 1 else ''} (total {obs.ecc_uncorrected_total})")
    if pending:
        parts.append("row remapping pending: reset the GPU to apply it")
    xids = [x for x in hardware_xids(obs, cfg) if x in ECC_XIDS]
    if xids:
        parts.append(", ".join(describe(x) for x in xids))
    evidence = {
        "metric": "ecc_uncorrected_new" if new > 0 else "remapped_rows_pending",
        "value": new if new > 0 else True,
        "ecc_uncorrected_new": new,
        "ecc_uncorrected_total": obs.ecc_uncorrected_total,
        "remapped_rows_pending": pending,
    }
    if xids:
        evidence["xids"] = xids
    return Finding(cause=CAUSE, severity="critical", summary=f"{gpu_label(obs)} " + "; ".join(parts),
                   evidence=evidence, immediate=new > 0)
