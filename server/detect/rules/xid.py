"""xid: a hardware XID in the kernel log for this GPU since its previous sample.

Only cfg.hardware_xids count: those mean the GPU, not the program, failed. Application XIDs
(13 graphics engine exception, 31 memory page fault, 43 GPU stopped processing) and unknown
ones never flag. One event is the fault, so the finding is immediate and critical. Realdata:
gpud dmesg-with-xid-119.log, repeated XID 119 (GSP RPC timeout) on one GPU of a node.

Hand-offs so one fault is one cause: on a GPU that reports lost the lost rule reports the XID;
an ECC-class XID (48, 63, 64, 92, 94, 95, 140) arriving with new uncorrected errors or pending
row remaps in the same sample is reported by the ecc rule, with the XID in its evidence.
"""

from __future__ import annotations

from server.detect.model import Finding, GpuObs, PeerStats, Window
from server.detect.rules._common import gpu_label
from server.detect.settings import DetectionSettings

CAUSE = "xid"

# Meanings from NVIDIA's XID catalogue, for the summary.
XID_MEANINGS = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint/warning",
    62: "internal micro-controller halt",
    63: "ECC page retirement / row remapping recording event",
    64: "ECC page retirement / row remapper recording failure",
    68: "video processor exception",
    69: "graphics engine class error",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}
ECC_XIDS = frozenset({48, 63, 64, 92, 94, 95, 140})


def describe(xid: int) -> str:
    meaning = XID_MEANINGS.get(xid)
    return f"XID {xid} ({meaning})" if meaning else f"XID {xid}"


def hardware_xids(obs: GpuObs, cfg: DetectionSettings) -> list[int]:
    wanted = set(cfg.hardware_xids)
    return sorted({x for x in obs.xids if x in wanted})


def ecc_evidence(obs: GpuObs) -> bool:
    return bool(obs.ecc_uncorrected_new) or bool(obs.remapped_rows_pending)


def evaluate(window: Window, peers: PeerStats | None, cfg: DetectionSettings) -> Finding | None:
    obs = window.latest
    if obs.lost:
        return None
    xids = hardware_xids(obs, cfg)
    if ecc_evidence(obs):
        xids = [x for x in xids if x not in ECC_XIDS]
    if not xids:
        return None
    others = sorted(set(obs.xids) - set(xids))
    summary = f"{gpu_label(obs)} hardware {', '.join(describe(x) for x in xids)}"
    evidence = {
        "metric": "xid",
        "value": xids,
        "xids": xids,
        "meanings": {str(x): XID_MEANINGS.get(x, "unknown") for x in xids},
    }
    if others:  # application XIDs, or ECC XIDs reported by the ecc rule
        evidence["other_xids"] = others
    return Finding(cause=CAUSE, severity="critical", summary=summary, evidence=evidence, immediate=True)
