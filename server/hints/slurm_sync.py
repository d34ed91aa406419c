"""`laggard slurm-sync`: drain the Slurm nodes whose hint is drain, resume the ones it drained;
raise the Weight of the nodes whose hint is avoid, restore it once they are well.

- Drain: `scontrol update NodeName=<node> State=DRAIN Reason="laggard: <cause>: <summary>"` for
  a node whose action is in hints.slurm_drain_actions and that is not drained already (a node
  someone else drained keeps their reason).
- Resume: `scontrol update NodeName=<node> State=RESUME` for a drained node whose Reason starts
  with hints.slurm_reason_prefix ("laggard:", or e.g. "NHC: laggard:" for the NHC convention)
  — so slurm-sync resumes only what it drained itself — once its action is in
  hints.slurm_resume_actions (ok). Which nodes it drained is read back from Slurm (`scontrol
  show node`, the Reason it wrote), not kept in a state file: Slurm is the single source of
  truth, nothing is lost when the host running the sync changes, and an operator who re-drains
  a node with a reason of their own takes it over.
  A node it drained that the hints no longer mention stays drained (no news is not health).
- Avoid: `scontrol update NodeName=<node> Weight=<w + slurm_avoid_weight> Comment="laggard
  raised Weight <w>-><w'>"` for a node whose action is in hints.slurm_avoid_actions: Slurm
  allocates the lowest-weight nodes first, so the node is chosen last but stays schedulable.
  The note in the node's Comment (appended to an operator's comment, which is kept) is how a
  oneshot sync remembers, across runs and hosts, that the weight is its own and what it was.
  Once the action is neither avoid nor drain (ok, rebalance) the weight goes back to <w> and the
  note goes. A weight someone else set since (neither <w'> nor <w>) is theirs: left as is, and
  only the note is dropped when the hint clears. A weight back at <w> while the hint is still
  avoid is what `scontrol reconfigure` or a slurmctld restart does (slurm.conf's Weight comes
  back, the Comment stays): raised again.
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
MAX_WEIGHT = 4_294_967_280  # scontrol (22.05): "Weight value (4294967294) is greater than 4294967280"
# The note slurm-sync keeps in a node's Comment while the node's Weight is its raise: "laggard
# raised Weight 1->1000001" (the weight before, the weight it set). No "Key=" in it, so that
# `scontrol -o show node` output still parses.
_WEIGHT_NOTE = re.compile(r"laggard raised Weight (\d+)->(\d+)")
_WEIGHT_NOTE_JOINED = re.compile(r"\s*;\s*laggard raised Weight \d+->\d+|laggard raised Weight \d+->\d+(?:\s*;\s*)?")


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


def comment_of(fields: Mapping[str, str]) -> str:
    comment = fields.get("Comment", "")
    return "" if comment == "(null)" else comment


def weight_note(comment: str) -> tuple[int, int] | None:
    """(weight before, weight slurm-sync set) from its note in a node's Comment, or None."""
    m = _WEIGHT_NOTE.search(comment)
    return (int(m.group(1)), int(m.group(2))) if m else None


def without_weight_note(comment: str) -> str:
    return _WEIGHT_NOTE_JOINED.sub("", comment).strip()


def with_weight_note(comment: str, before: int, raised: int) -> str:
    rest = without_weight_note(comment)
    note = f"laggard raised Weight {before}->{raised}"
    return f"{rest}; {note}" if rest else note


@dataclass(frozen=True)
class SlurmChange:
    node: str
    verb: str  # "drain", "resume", "raise" (Weight), "restore" (Weight and note), "unmark" (the note only)
    argv: tuple[str, ...]
    why: str

    def display(self) -> str:
        parts = []
        for arg in self.argv:
            key, eq, value = arg.partition("=")
            if eq and key in ("Reason", "Comment"):
                parts.append(f'{key}="' + re.sub(r'(["\\$`])', r"\\\1", value) + '"')
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
    acting = set(cfg.slurm_drain_actions) | set(cfg.slurm_avoid_actions)
    changes: list[SlurmChange] = []
    notes: list[str] = []
    for name in sorted(set(slurm_nodes) | {n for n, h in hints.items() if h["action"] in acting}):
        fields = slurm_nodes.get(name)
        hint = hints.get(name)
        if fields is None:
            notes.append(f"node {name}: hint {hint['action']} but Slurm does not know it")
            continue
        for part in (_drain_plan, _weight_plan):
            more_changes, more_notes = part(name, fields, hint, cfg)
            changes += more_changes
            notes += more_notes
    return changes, notes


def _drain_plan(name: str, fields: Mapping[str, str], hint: Mapping[str, Any] | None,
                cfg: HintSettings) -> tuple[list[SlurmChange], list[str]]:
    scontrol = cfg.scontrol_path
    reason = fields.get("Reason", "")
    ours = reason.startswith(cfg.slurm_reason_prefix)
    if hint is not None and hint["action"] in cfg.slurm_drain_actions:
        if not is_drained(fields):
            why = drain_reason(hint, cfg)
            return [SlurmChange(name, "drain", (scontrol, "update", f"NodeName={name}", "State=DRAIN", f"Reason={why}"), why)], []
        if not ours:
            return [], [f"node {name}: hint drain; already drained by someone else ({reason or 'no reason'}), left as is"]
    elif is_drained(fields) and ours:
        if hint is None:
            return [], [f"node {name}: drained by laggard, no hints for it now: left drained"]
        if hint["action"] in cfg.slurm_resume_actions:
            return [SlurmChange(name, "resume", (scontrol, "update", f"NodeName={name}", "State=RESUME"),
                                f"healthy again ({hint['action']}); was: {reason}")], []
        return [], [f"node {name}: drained by laggard, now {hint['action']}: left drained until {'/'.join(cfg.slurm_resume_actions)}"]
    return [], []


def _weight_plan(name: str, fields: Mapping[str, str], hint: Mapping[str, Any] | None,
                 cfg: HintSettings) -> tuple[list[SlurmChange], list[str]]:
    """Avoid: Weight raised (Slurm allocates the lowest weights first), with a note in the Comment;
    well again: the weight before and no note. Only a weight that is still slurm-sync's own is
    changed back (see the module doc)."""
    action = hint["action"] if hint is not None else None
    comment = comment_of(fields)
    note = weight_note(comment)
    try:
        weight: int | None = int(fields.get("Weight", ""))
    except ValueError:
        weight = None

    def update(verb: str, why: str, *values: str) -> SlurmChange:
        return SlurmChange(name, verb, (cfg.scontrol_path, "update", f"NodeName={name}", *values), why)

    if action is not None and action in cfg.slurm_avoid_actions:
        if weight is None:
            return [], [f"node {name}: hint {action} but Slurm shows no Weight for it: left as is"]
        if note is not None and weight == note[1]:
            return [], []  # raised already
        if note is not None and weight != note[0]:
            return [], [f"node {name}: hint {action}; Weight {weight} set by someone else since laggard raised it "
                        f"{note[0]}->{note[1]}: left as is"]
        raised = min(weight + cfg.slurm_avoid_weight, MAX_WEIGHT)
        if raised == weight:
            return [], [f"node {name}: hint {action} but its Weight {weight} is Slurm's largest already: left as is"]
        again = " again (back at its own weight: scontrol reconfigure or a slurmctld restart)" if note else ""
        return [update("raise", f"hint {action}: Weight {weight}->{raised}{again}", f"Weight={raised}",
                       f"Comment={with_weight_note(comment, weight, raised)}")], []
    if note is None:
        return [], []
    before, raised = note
    if action is None:
        return [], [f"node {name}: Weight raised by laggard, no hints for it now: left raised"]
    if action in cfg.slurm_drain_actions:
        return [], []  # the drain keeps it out; the weight goes back once the node is well
    if weight == raised:
        return [update("restore", f"hint {action}: Weight {raised}->{before}, its weight before laggard", f"Weight={before}",
                       f"Comment={without_weight_note(comment)}")], []
    whose = "back at its weight before laggard" if weight == before else f"set to {weight} by someone else"
    return [update("unmark", f"hint {action}: Weight {whose}, left as is; laggard's note dropped",
                   f"Comment={without_weight_note(comment)}")], []


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
    n = {verb: sum(c.verb == verb for c in changes) for verb in ("drain", "resume", "raise", "restore", "unmark")}
    verb = "done" if apply else "planned (dry run; --apply to act)"
    weights = "weight" if n["raise"] == 1 else "weights"
    out(f"{n['drain']} to drain, {n['resume']} to resume, {n['raise']} {weights} to raise, {n['restore'] + n['unmark']} to restore: "
        f"{verb}" + (f"; {len(failed)} failed" if failed else ""))
    if failed:
        raise SlurmError(f"scontrol failed for {', '.join(failed)}")
    return changes
