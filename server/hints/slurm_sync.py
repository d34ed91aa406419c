"""`laggard slurm-sync`: drain the Slurm nodes whose hint is drain, resume the ones it drained.

- Drain: `scontrol update NodeName=<node> State=DRAIN Reason="laggard: <cause>: <summary>"` for
  a node whose action is in hints.slurm_drain_actions and that is not drained already (a node
  someone else drained keeps their reason).
- Resume: `scontrol update NodeName=<node> State=RESUME` for a drained node whose Reason starts
  with hints.slurm_reason_prefix ("laggard:") — so slurm-sync resumes only what it drained
  itself — once its action is in hints.slurm_resume_actions (ok). Which nodes it drained is
  read back from Slurm (`scontrol show node`, the Reason it wrote), not kept in a state file:
  Slurm is the single source of truth, nothing is lost when the host running the sync changes,
  and an operator who re-drains a node with a reason of their own takes it over.
  A node it drained that the hints no longer mention stays drained (no news is not health).
Dry-run (the default) prints the commands and runs only `scontrol show node`.
"""

from __future__ import annotations

import logging
import re
import shlex
import subprocess
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from server.hints.render import by_node_name
from server.hints.settings import RANK, HintSettings

log = logging.getLogger(__name__)
# Values that run to the end of their line in `scontrol show node` (they may hold spaces).
_LINE_VALUES = ("Reason", "OS", "Comment", "Extra")
_KEY = re.compile(r"(?:(?<=\s)|^)([A-Za-z][A-Za-z0-9_/:.]*)=")
_REASON_STAMP = re.compile(r"\s*\[[^\[\]]*@[^\[\]]*\]\s*$")  # " [root@2024-05-01T10:00:00]"
MAX_REASON = 250


def parse_show_node(text: str) -> dict[str, dict[str, str]]:
    """`scontrol show node` output (multi-line records separated by blank lines, or -o one
    record per line) → node name → {key: value}. Reason loses Slurm's trailing [user@time]."""
    records: list[str] = []
    current: list[str] = []
    for line in text.splitlines():
        if line.startswith("NodeName=") and current:
            records.append("\n".join(current))
            current = []
        if line.strip():
            current.append(line)
    if current:
        records.append("\n".join(current))
    nodes: dict[str, dict[str, str]] = {}
    for record in records:
        fields = _parse_record(record)
        if "NodeName" in fields:
            if "Reason" in fields:
                fields["Reason"] = _REASON_STAMP.sub("", fields["Reason"])
            nodes[fields["NodeName"]] = fields
    return nodes


def _parse_record(record: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in record.splitlines():
        stripped = line.strip()
        key = stripped.partition("=")[0]
        if key in _LINE_VALUES:
            fields[key] = stripped.partition("=")[2].strip()
            continue
        matches = list(_KEY.finditer(stripped))
        for i, m in enumerate(matches):
            end = matches[i + 1].start() if i + 1 < len(matches) else len(stripped)
            name = m.group(1)
            value = stripped[m.end():end].strip()
            if name in _LINE_VALUES:  # -o: a free-text value runs up to the next Key=
                fields[name] = value
            else:
                fields[name] = value.split()[0] if value else ""
    return fields


def is_drained(fields: Mapping[str, str]) -> bool:
    """DRAIN flag set: IDLE+DRAIN, MIXED+DRAIN (draining), DOWN+DRAIN, DRAINED, DRAINING..."""
    return "DRAIN" in fields.get("State", "").upper()


@dataclass(frozen=True)
class SlurmChange:
    node: str
    verb: str  # "drain" or "resume"
    argv: tuple[str, ...]
    why: str

    def display(self) -> str:
        parts = []
        for arg in self.argv:
            if arg.startswith("Reason="):
                value = arg[len("Reason="):]
                parts.append('Reason="' + re.sub(r'(["\\$`])', r"\\\1", value) + '"')
            else:
                parts.append(shlex.quote(arg))
        return " ".join(parts)


# Slurm reasons travel through scontrol, sinfo, logs and NHC scripts that assume ASCII ("°C"
# came back as mojibake): the symbols Laggard's texts use, spelled out; anything else decomposed
# to its ASCII letters (é -> e) or dropped.
_ASCII_SPELLINGS = {"°C": " C", "°": " deg", "×": "x", "−": "-", "–": "-", "—": "-", "µ": "u", "…": "...", "≥": ">=", "≤": "<="}


def ascii_reason(text: str) -> str:
    for symbol, spelled in _ASCII_SPELLINGS.items():
        text = text.replace(symbol, spelled)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    return " ".join(text.split())


def drain_reason(hint: Mapping[str, Any], cfg: HintSettings) -> str:
    return ascii_reason(f"{cfg.slurm_reason_prefix} {hint['text'] or hint['action']}")[:MAX_REASON]


def plan(slurm_nodes: Mapping[str, Mapping[str, str]], doc: Mapping[str, Any], cfg: HintSettings) -> tuple[list[SlurmChange], list[str]]:
    """The scontrol commands that bring Slurm in step with the hints, and notes on nodes left alone."""
    hints = in_slurm_names(by_node_name(doc), set(slurm_nodes))
    scontrol = cfg.scontrol_path
    changes: list[SlurmChange] = []
    notes: list[str] = []
    for name in sorted(set(slurm_nodes) | {n for n, h in hints.items() if h["action"] in cfg.slurm_drain_actions}):
        fields = slurm_nodes.get(name)
        hint = hints.get(name)
        if fields is None:
            notes.append(f"node {name}: hint {hint['action']} but Slurm does not know it")
            continue
        reason = fields.get("Reason", "")
        ours = reason.startswith(cfg.slurm_reason_prefix)
        if hint is not None and hint["action"] in cfg.slurm_drain_actions:
            if not is_drained(fields):
                why = drain_reason(hint, cfg)
                changes.append(SlurmChange(name, "drain", (scontrol, "update", f"NodeName={name}", "State=DRAIN", f"Reason={why}"), why))
            elif not ours:
                notes.append(f"node {name}: hint drain; already drained by someone else ({reason or 'no reason'}), left as is")
        elif is_drained(fields) and ours:
            if hint is None:
                notes.append(f"node {name}: drained by laggard, no hints for it now: left drained")
            elif hint["action"] in cfg.slurm_resume_actions:
                changes.append(SlurmChange(name, "resume", (scontrol, "update", f"NodeName={name}", "State=RESUME"),
                                           f"healthy again ({hint['action']}); was: {reason}"))
            else:
                notes.append(f"node {name}: drained by laggard, now {hint['action']}: left drained until {'/'.join(cfg.slurm_resume_actions)}")
    return changes, notes


def in_slurm_names(hints: dict[str, dict[str, Any]], slurm_names: set[str]) -> dict[str, dict[str, Any]]:
    """The hints keyed by Slurm's NodeNames: an agent reporting gpu-017.cluster.example matches the
    NodeName gpu-017, and an agent reporting gpu-017 matches gpu-017.cluster.example, when only one
    Slurm node has that short name. A name Slurm has exactly is kept; so is one it has not at all
    (noted by plan()). Two names landing on one node: the graver hint wins, as by_node_name does."""
    slurm_by_short: dict[str, list[str]] = {}
    for name in slurm_names:
        slurm_by_short.setdefault(_short(name), []).append(name)
    out: dict[str, dict[str, Any]] = {}
    for name, hint in hints.items():
        candidates = slurm_by_short.get(_short(name), [])
        target = name if name in slurm_names or len(candidates) != 1 else candidates[0]
        prev = out.get(target)
        if prev is None or RANK[hint["action"]] > RANK[prev["action"]]:
            out[target] = hint
    return out


def _short(name: str) -> str:
    return name.split(".", 1)[0]


def show_nodes(cfg: HintSettings, *, timeout: float = 60.0) -> dict[str, dict[str, str]]:
    result = subprocess.run([cfg.scontrol_path, "show", "node"], capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0:
        raise SlurmError(f"scontrol show node failed ({result.returncode}): {result.stderr.strip()[:500]}")
    return parse_show_node(result.stdout)


class SlurmError(RuntimeError):
    pass


def sync_once(doc: Mapping[str, Any], cfg: HintSettings, *, apply: bool, out=print, timeout: float = 60.0) -> list[SlurmChange]:
    changes, notes = plan(show_nodes(cfg, timeout=timeout), doc, cfg)
    failed = []
    for change in changes:
        out(change.display() if apply else f"(dry run) {change.display()}")
        if apply:
            result = subprocess.run(list(change.argv), capture_output=True, text=True, timeout=timeout, check=False)
            if result.returncode != 0:
                failed.append(change.node)
                out(f"node {change.node}: FAILED ({result.returncode}): {result.stderr.strip()[:500]}")
    for note in notes:
        out(note)
    drains = sum(c.verb == "drain" for c in changes)
    verb = "done" if apply else "planned (dry run; --apply to act)"
    out(f"{drains} to drain, {len(changes) - drains} to resume: {verb}" + (f"; {len(failed)} failed" if failed else ""))
    if failed:
        raise SlurmError(f"scontrol failed for {', '.join(failed)}")
    return changes
