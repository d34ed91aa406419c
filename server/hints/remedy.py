"""Faults that a cool-down does not heal: a hardware XID whose remedy is a GPU reset, a reboot or a
field check keeps its hint (drain) after its episode resolved until the evidence shows the
remedy happened, or an operator acknowledged it (`laggard ack`, POST /api/v1/acks).

The remedy of each XID is the "Resolution Bucket (Immediate Action)" of NVIDIA's XID catalogue
(docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html):
  RESET_GPU and the DBE / NVLink workflows → reset;  RESTART_BM → reboot;
  CONTACT_SUPPORT → field;  RESTART_APP and IGNORE → none (the cool-down is enough).
A hardware XID the table does not name is taken as needing a field check: the safe side.

Evidence that a reset or reboot happened (GpuFacts, gathered by service.load_hints):
  - the node booted after the fault's onset (boot_time, which the agent reports from
    /proc/stat btime; both are the node's own clock), and
  - the same GPU (its UUID) was sampled after that boot, not lost and with no row remapping
    pending ("clean counters": new uncorrected ECC errors or XIDs after the boot open episodes
    of their own, which hold the hint anyway).
A reboot resets every GPU, so it counts for a reset too. A GPU reset alone (nvidia-smi -r)
leaves no trace that the agent's readings can tell apart from a driver reload or an agent
restart (the ECC counters are the InfoROM's lifetime totals), so it is confirmed by an ack.
Evidence for any remedy, a field check included: the slot now holds a GPU with another UUID
(the GPU was replaced). An ack covers the faults of its node (or one GPU of it) that began at
or before the sample time it was given at; a later fault is held again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

Remedy = Literal["reset", "reboot", "field"]
RemedyOrNone = Literal["reset", "reboot", "field", "none"]
# Graver last: a fault with several XIDs needs the gravest of their remedies.
_RANK = {"none": 0, "reset": 1, "reboot": 2, "field": 3}

XID_REMEDIES: dict[int, RemedyOrNone] = {
    48: "reset",  # double-bit ECC error: WORKFLOW_XID_48 (reset to retire / remap the row)
    61: "field",  # internal micro-controller breakpoint: CONTACT_SUPPORT
    62: "reset",  # internal micro-controller halt: RESET_GPU
    63: "none",  # row remapping recording event: IGNORE
    64: "reset",  # row remapping failure: RESET_GPU
    68: "none",  # NVDEC0 exception: RESTART_APP
    69: "none",  # graphics engine class error: RESTART_APP
    74: "reset",  # NVLink error: WORKFLOW_NVLINK_ERR (reset, then look at the link)
    79: "reboot",  # GPU has fallen off the bus: RESTART_BM
    92: "none",  # high single-bit ECC error rate: IGNORE
    94: "none",  # contained ECC error: RESTART_APP
    95: "reset",  # uncontained ECC error: RESET_GPU
    119: "reset",  # GSP RPC timeout: RESET_GPU
    120: "reset",  # GSP error: RESET_GPU
    140: "reset",  # unrecovered ECC error: RESET_GPU
}
UNKNOWN_XID_REMEDY: Remedy = "field"
WHAT_CLEARS = {
    "reset": "a GPU reset (a reboot of the node shows it) or laggard ack",
    "reboot": "a reboot of the node or laggard ack",
    "field": "a field check: a replaced GPU or laggard ack",
}


@dataclass(frozen=True)
class GpuFacts:
    """What the collector knows of a GPU now."""

    uuid: str | None = None  # the UUID in the slot now
    boot_time: float | None = None  # when its node last booted (agent-reported)
    last_ts: float | None = None  # the newest sample of the GPU the fault was on (by UUID)
    last_lost: bool | None = None
    last_remap_pending: bool | None = None


@dataclass(frozen=True)
class Ack:
    """An operator's word that the remedy happened, for a node (gpu None) or one GPU."""

    cluster: str
    node: str
    gpu: int | None
    sample_time: float  # the node's newest sample time when acknowledged: faults up to it are covered
    acked_at: float  # wall clock
    acked_by: str  # the token's name (or key id)
    note: str = ""


def remedy_for(episode: Mapping[str, Any], table: Mapping[int, RemedyOrNone] = XID_REMEDIES) -> Remedy | None:
    """The remedy a fault episode needs before its GPU may work again; None: the cool-down is enough."""
    ev = episode.get("evidence") or {}
    xids = ev.get("xids") if isinstance(ev.get("xids"), list) else []
    remedies = [table.get(x, UNKNOWN_XID_REMEDY) for x in xids if isinstance(x, int) and not isinstance(x, bool)]
    if episode.get("cause") == "ecc" and (ev.get("ecc_uncorrected_new") or 0) > 0:
        remedies.append("reset")  # new uncorrected errors: the DBE workflow, as XID 48
    elif episode.get("cause") != "xid":
        return None
    worst = max(remedies, key=_RANK.__getitem__, default="none")
    return None if worst == "none" else worst  # type: ignore[return-value]


def remedy_evidence(episode: Mapping[str, Any], remedy: Remedy, facts: GpuFacts | None) -> str | None:
    """What shows that the remedy happened, or None."""
    if facts is None:
        return None
    uuid = episode.get("uuid")
    if facts.uuid and uuid and facts.uuid != uuid:
        return f"GPU replaced ({uuid} → {facts.uuid})"
    if remedy == "field" or facts.boot_time is None or facts.boot_time <= float(episode["onset"]):
        return None
    if facts.last_ts is None or facts.last_ts <= facts.boot_time or facts.last_lost or facts.last_remap_pending:
        return None
    return f"node rebooted after the fault (boot time {facts.boot_time:.0f}), GPU sampled since, clean"


def covering_ack(episode: Mapping[str, Any], acks: Iterable[Ack]) -> Ack | None:
    """The newest ack that covers this episode's entity and onset."""
    found = None
    for ack in acks:
        if (ack.cluster, ack.node) != (episode["cluster"], episode["node"]):
            continue
        if ack.gpu is not None and ack.gpu != episode.get("gpu"):
            continue
        if ack.sample_time >= float(episode["onset"]) and (found is None or ack.acked_at > found.acked_at):
            found = ack
    return found


def hold(episode: Mapping[str, Any], facts: GpuFacts | None, acks: Iterable[Ack],
         table: Mapping[int, RemedyOrNone] = XID_REMEDIES) -> dict[str, Any] | None:
    """Why a resolved fault still holds its hint ({remedy, until}), or None when it does not.
    Open episodes hold by being open; only resolved ones need this."""
    if episode.get("resolved_at") is None:
        return None
    remedy = remedy_for(episode, table)
    if remedy is None or remedy_evidence(episode, remedy, facts) or covering_ack(episode, acks):
        return None
    return {"remedy": remedy, "until": WHAT_CLEARS[remedy]}

