"""`laggard slurm-sync` against a recording stand-in for scontrol: a small executable that logs its
argv, answers `scontrol show node` the way Slurm prints it, and applies `update` to its state.
Drains nodes whose hint is drain, resumes only the nodes it drained itself (found by the Reason
prefix it wrote, read back from `show node`) once they are healthy; dry run by default."""

from __future__ import annotations

import json
import stat
import sys

import pytest

from server.cli import main as laggard
from server.hints.settings import HintSettings
from server.hints.slurm_sync import SlurmChange, drain_reason, in_slurm_names, parse_show_node, plan
from tests.hints.helpers import HintsServer, hint_doc

SHOW_NODE = """\
NodeName=gpu-001 Arch=x86_64 CoresPerSocket=48
   CPUAlloc=96 CPUEfctv=96 CPUTot=96 CPULoad=88.52
   AvailableFeatures=h100,ib
   ActiveFeatures=h100,ib
   Gres=gpu:h100:8(S:0-1)
   NodeAddr=gpu-001 NodeHostName=gpu-001 Version=23.11.4
   OS=Linux 5.15.0-105-generic #115-Ubuntu SMP Mon Apr 15 09:52:04 UTC 2024
   RealMemory=2063000 AllocMem=1900000 FreeMem=120000 Sockets=2 Boards=1
   State=MIXED+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
   Partitions=gpu
   BootTime=2024-05-01T08:00:00 SlurmdStartTime=2024-05-01T08:01:10
   LastBusyTime=2024-05-02T09:00:00 ResumeAfterTime=None
   CfgTRES=cpu=96,mem=2063000M,billing=96,gres/gpu=8
   AllocTRES=cpu=96,mem=1900000M,gres/gpu=8
   CapWatts=n/a
   CurrentWatts=0 AveWatts=0
   ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s
   Reason=laggard: xid: GPU 3 hardware XID 79 (GPU has fallen off the bus) [root@2024-05-02T10:00:00]

NodeName=gpu-002 Arch=x86_64 CoresPerSocket=48
   State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
   Partitions=gpu

"""


def test_parse_show_node():
    nodes = parse_show_node(SHOW_NODE)
    assert list(nodes) == ["gpu-001", "gpu-002"]
    a = nodes["gpu-001"]
    assert a["State"] == "MIXED+DRAIN" and a["Partitions"] == "gpu" and a["CfgTRES"] == "cpu=96,mem=2063000M,billing=96,gres/gpu=8"
    assert a["Reason"] == "laggard: xid: GPU 3 hardware XID 79 (GPU has fallen off the bus)"  # Slurm's [user@time] dropped
    assert a["OS"].startswith("Linux 5.15.0-105-generic #115-Ubuntu")
    assert "Reason" not in nodes["gpu-002"] and nodes["gpu-002"]["State"] == "IDLE"


def test_parse_one_line_output():
    text = ("NodeName=a Arch=x86_64 State=IDLE+DRAIN Partitions=gpu "
            "Reason=laggard: ecc: GPU 0 2 new uncorrected ECC errors [root@2024-05-02T10:00:00] Comment=(null)\n"
            "NodeName=b Arch=x86_64 State=ALLOCATED Partitions=gpu\n")
    nodes = parse_show_node(text)
    assert nodes["a"]["Reason"] == "laggard: ecc: GPU 0 2 new uncorrected ECC errors" and nodes["a"]["Comment"] == "(null)"
    assert nodes["b"]["State"] == "ALLOCATED"


PLAN_CASES = [
    # hint action, Slurm state, Slurm reason, expected verb (None: left alone)
    ("drain", "IDLE", None, "drain"),
    ("drain", "ALLOCATED", None, "drain"),
    ("drain", "DOWN", None, "drain"),
    ("drain", "IDLE+DRAIN", "laggard: xid: GPU 3", None),  # already ours
    ("drain", "MIXED+DRAIN", "bad DIMM", None),  # someone else's drain: left as is
    ("avoid", "IDLE", None, None),
    ("ok", "IDLE+DRAIN", "laggard: xid: GPU 3", "resume"),
    ("ok", "DOWN+DRAIN", "laggard: xid: GPU 3", "resume"),
    ("ok", "IDLE+DRAIN", "bad DIMM", None),  # not ours: never resumed
    ("rebalance", "IDLE+DRAIN", "laggard: xid: GPU 3", None),  # not healthy yet
    (None, "IDLE+DRAIN", "laggard: xid: GPU 3", None),  # no hints for it: no news is not health
]


@pytest.mark.parametrize(("action", "state", "reason", "verb"), PLAN_CASES)
def test_plan(action, state, reason, verb):
    fields = {"NodeName": "n", "State": state, **({"Reason": reason} if reason else {})}
    doc = hint_doc(("n", action, 0.0, [("xid", "GPU 3 hardware XID 79")])) if action else hint_doc()
    changes, _ = plan({"n": fields}, doc, HintSettings(scontrol_path="/opt/slurm/bin/scontrol"))
    assert [c.verb for c in changes] == ([verb] if verb else [])
    if verb == "drain":
        assert changes[0].argv == ("/opt/slurm/bin/scontrol", "update", "NodeName=n", "State=DRAIN",
                                   "Reason=laggard: xid: GPU 3 hardware XID 79")
    if verb == "resume":
        assert changes[0].argv == ("/opt/slurm/bin/scontrol", "update", "NodeName=n", "State=RESUME")


def test_display_quotes_the_reason_like_the_issue_shows():
    change = SlurmChange("n", "drain", ("scontrol", "update", "NodeName=n", "State=DRAIN", 'Reason=laggard: say "hi" $HOME'), "")
    assert change.display() == 'scontrol update NodeName=n State=DRAIN Reason="laggard: say \\"hi\\" \\$HOME"'


# --- the stand-in scontrol -----------------------------------------------------------------------

STANDIN = '''\
#!{python}
"""scontrol stand-in: logs argv, prints `show node` from its state file, applies `update`."""
import json, sys
STATE, LOG = {state!r}, {log!r}
with open(LOG, "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
nodes = json.load(open(STATE))
args = sys.argv[1:]
if args[:2] == ["show", "node"]:
    for name, n in nodes.items():
        print(f"NodeName={{name}} Arch=x86_64 CoresPerSocket=48")
        print("   CPUAlloc=0 CPUEfctv=96 CPUTot=96 CPULoad=0.10")
        print(f"   NodeAddr={{name}} NodeHostName={{name}} Version=23.11.4")
        print("   OS=Linux 5.15.0-105-generic #115-Ubuntu SMP Mon Apr 15 09:52:04 UTC 2024")
        print(f"   State={{n['state']}} ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A")
        print("   Partitions=gpu")
        print("   CfgTRES=cpu=96,mem=2063000M,billing=96,gres/gpu=8")
        if n.get("reason"):
            print(f"   Reason={{n['reason']}} [root@2024-05-02T10:00:00]")
        print()
    sys.exit(0)
if args and args[0] == "update":
    kv = dict(a.split("=", 1) for a in args[1:])
    name = kv["NodeName"]
    if name not in nodes:
        print(f"slurm_update error: Invalid node name specified", file=sys.stderr)
        sys.exit(1)
    base = nodes[name]["state"].split("+")[0]
    if kv["State"] == "DRAIN":
        nodes[name] = {{"state": base + "+DRAIN", "reason": kv["Reason"]}}
    elif kv["State"] == "RESUME":
        nodes[name] = {{"state": base}}
    json.dump(nodes, open(STATE, "w"))
    sys.exit(0)
print("unsupported", args, file=sys.stderr)
sys.exit(2)
'''


class Scontrol:
    def __init__(self, tmp_path, nodes: dict):
        self.state, self.log = tmp_path / "slurm.json", tmp_path / "argv.log"
        self.state.write_text(json.dumps(nodes))
        self.path = tmp_path / "scontrol"
        self.path.write_text(STANDIN.format(python=sys.executable, state=str(self.state), log=str(self.log)))
        self.path.chmod(self.path.stat().st_mode | stat.S_IXUSR)

    def calls(self) -> list[list[str]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []

    def nodes(self) -> dict:
        return json.loads(self.state.read_text())


@pytest.fixture
def scontrol(tmp_path):
    return Scontrol(tmp_path, {
        "gpu-001": {"state": "IDLE"},  # hint drain → drained
        "gpu-002": {"state": "ALLOCATED"},  # hint avoid → left
        "gpu-003": {"state": "MIXED+DRAIN", "reason": "bad DIMM, ticket 4711"},  # drained by someone else
        "gpu-004": {"state": "IDLE+DRAIN", "reason": "laggard: thermal: GPU 2 HW slowdown"},  # ours, healthy now → resumed
        "gpu-005": {"state": "IDLE"},  # healthy
    })


DOC = hint_doc(
    ("gpu-001", "drain", 0.0, [("xid", "GPU 3 hardware XID 79 (GPU has fallen off the bus)")]),
    ("gpu-002", "avoid", 0.6, [("thermal", "GPU 5 HW thermal slowdown")]),
    ("gpu-003", "drain", 0.0, [("ecc", "GPU 1 uncorrected ECC")]),
    ("gpu-004", "ok", 1.0, []),
    ("gpu-005", "ok", 1.0, []),
    ("gpu-999", "drain", 0.0, [("lost", "GPU 0 lost")]),
)


def test_dry_run_only_reads(scontrol, capsys):
    with HintsServer(DOC) as hints:
        assert laggard(["slurm-sync", "--server", hints.url, "--scontrol", str(scontrol.path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert scontrol.calls() == [["show", "node"]]
    assert out[:2] == [
        f'(dry run) {scontrol.path} update NodeName=gpu-001 State=DRAIN Reason="laggard: xid: GPU 3 hardware XID 79 (GPU has fallen off the bus)"',
        f"(dry run) {scontrol.path} update NodeName=gpu-004 State=RESUME",
    ]
    assert "node gpu-003: hint drain; already drained by someone else (bad DIMM, ticket 4711), left as is" in out
    assert "node gpu-999: hint drain but Slurm does not know it" in out
    assert out[-1] == "1 to drain, 1 to resume: planned (dry run; --apply to act)"


def test_apply_drains_and_resumes_only_its_own(scontrol, monkeypatch):
    monkeypatch.setenv("LAGGARD_HINTS__SCONTROL_PATH", str(scontrol.path))  # the setting, not the flag
    with HintsServer(DOC) as hints:
        assert laggard(["slurm-sync", "--server", hints.url, "--apply"]) == 0
        assert scontrol.calls() == [
            ["show", "node"],
            ["update", "NodeName=gpu-001", "State=DRAIN", "Reason=laggard: xid: GPU 3 hardware XID 79 (GPU has fallen off the bus)"],
            ["update", "NodeName=gpu-004", "State=RESUME"],
        ]
        nodes = scontrol.nodes()
        assert nodes["gpu-001"] == {"state": "IDLE+DRAIN", "reason": "laggard: xid: GPU 3 hardware XID 79 (GPU has fallen off the bus)"}
        assert nodes["gpu-003"]["reason"] == "bad DIMM, ticket 4711" and nodes["gpu-004"] == {"state": "IDLE"}

        # Again: in step, only the read.
        assert laggard(["slurm-sync", "--server", hints.url, "--apply"]) == 0
        assert scontrol.calls()[3:] == [["show", "node"]]

        # gpu-001 healthy (cool-down passed) and gpu-003 healthy: only ours is resumed.
        hints.doc = hint_doc(("gpu-001", "ok", 1.0, []), ("gpu-003", "ok", 1.0, []))
        assert laggard(["slurm-sync", "--server", hints.url, "--apply"]) == 0
        assert scontrol.calls()[4:] == [["show", "node"], ["update", "NodeName=gpu-001", "State=RESUME"]]
        assert scontrol.nodes()["gpu-001"] == {"state": "IDLE"} and scontrol.nodes()["gpu-003"]["state"] == "MIXED+DRAIN"


def test_scontrol_failures_are_reported(tmp_path, capsys):
    failing = tmp_path / "scontrol"
    failing.write_text("#!/bin/sh\necho 'slurm_load_node error: Unable to contact slurm controller' >&2\nexit 1\n")
    failing.chmod(0o755)
    with HintsServer(DOC) as hints:
        assert laggard(["slurm-sync", "--server", hints.url, "--scontrol", str(failing), "--apply"]) == 1
    assert "Unable to contact slurm controller" in capsys.readouterr().err


@pytest.mark.parametrize(("text", "reason"), [
    ("thermal: GPU 5 HW thermal slowdown, 92 °C vs 80 °C", "laggard: thermal: GPU 5 HW thermal slowdown, 92 C vs 80 C"),
    ("clock: GPU 2 SM clock −49% (8×A100 peers) — node café", "laggard: clock: GPU 2 SM clock -49% (8xA100 peers) - node cafe"),
    ("xid: GPU 6 hardware XID 79\n(GPU has fallen off the bus)", "laggard: xid: GPU 6 hardware XID 79 (GPU has fallen off the bus)"),
])
def test_drain_reasons_are_ascii(text, reason):
    # Issue #16: "°C" reached Slurm's reasons; sinfo, logs and NHC scripts assume ASCII.
    got = drain_reason({"text": text, "action": "drain"}, HintSettings())
    assert got == reason and got.isascii()


def _hint(action: str) -> dict:
    return {"action": action, "capacity": 1.0 if action == "ok" else 0.0, "cause": None, "text": ""}


@pytest.mark.parametrize(("agents", "slurm", "expected"), [
    # Agents report FQDNs, Slurm has short NodeNames (issue #16), and the reverse.
    ({"gpu-017.c.example": "drain"}, {"gpu-017", "gpu-018"}, {"gpu-017": "drain"}),
    ({"gpu-017": "drain"}, {"gpu-017.c.example", "gpu-018.c.example"}, {"gpu-017.c.example": "drain"}),
    ({"gpu-017": "drain"}, {"gpu-017"}, {"gpu-017": "drain"}),  # exact names stay exact
    # Two Slurm nodes with that short name: no guess; plan() notes the name Slurm does not know.
    ({"gpu-017": "drain"}, {"gpu-017.a.example", "gpu-017.b.example"}, {"gpu-017": "drain"}),
    # Two agent names on one Slurm node: the graver hint wins.
    ({"gpu-017": "ok", "gpu-017.c.example": "drain"}, {"gpu-017"}, {"gpu-017": "drain"}),
])
def test_agent_names_match_slurm_names_short_or_fully_qualified(agents, slurm, expected):
    got = in_slurm_names({n: _hint(a) for n, a in agents.items()}, slurm)
    assert {n: h["action"] for n, h in got.items()} == expected


def test_an_fqdn_agent_drains_its_short_named_slurm_node():
    doc = hint_doc(("gpu-017.c.example", "drain", 0.0, [("xid", "GPU 1 hardware XID 79")]))
    changes, notes = plan({"gpu-017": {"State": "IDLE", "Reason": ""}}, doc, HintSettings())
    assert [(c.node, c.verb) for c in changes] == [("gpu-017", "drain")] and notes == []
