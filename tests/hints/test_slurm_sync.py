"""`laggard slurm-sync` against a recording stand-in for scontrol: a small executable that logs its
argv, answers `scontrol show node` the way Slurm prints it, and applies `update` to its state.
Drains nodes whose hint is drain, resumes only the nodes it drained itself (found by the Reason
prefix it wrote, read back from `show node`) once they are healthy; raises the Weight of avoid
nodes and restores it, only where the weight is still its own (found by its note in the node's
Comment); dry run by default."""

from __future__ import annotations

import json
import stat
import sys

import pytest

from server.cli.main import main as laggard
from server.hints.settings import HintSettings
from server.hints.slurm_sync import (
    MAX_WEIGHT,
    SlurmChange,
    drain_reason,
    in_slurm_names,
    parse_show_node,
    plan,
    weight_note,
    with_weight_note,
    without_weight_note,
)
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
    ("avoid", "IDLE+DRAIN", "bad DIMM", None),  # avoid never drains nor resumes (its weight: WEIGHT_CASES)
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
    changes = [c for c in changes if c.verb in ("drain", "resume")]
    assert [c.verb for c in changes] == ([verb] if verb else [])
    if verb == "drain":
        assert changes[0].argv == ("/opt/slurm/bin/scontrol", "update", "NodeName=n", "State=DRAIN",
                                   "Reason=laggard: xid: GPU 3 hardware XID 79")
    if verb == "resume":
        assert changes[0].argv == ("/opt/slurm/bin/scontrol", "update", "NodeName=n", "State=RESUME")


def test_display_quotes_the_reason_like_the_issue_shows():
    change = SlurmChange("n", "drain", ("scontrol", "update", "NodeName=n", "State=DRAIN", 'Reason=laggard: say "hi" $HOME'), "")
    assert change.display() == 'scontrol update NodeName=n State=DRAIN Reason="laggard: say \\"hi\\" \\$HOME"'
    change = SlurmChange("n", "raise", ("scontrol", "update", "NodeName=n", "Weight=1000001", "Comment=rack 7; laggard raised Weight 1->1000001"), "")
    assert change.display() == 'scontrol update NodeName=n Weight=1000001 Comment="rack 7; laggard raised Weight 1->1000001"'
    assert SlurmChange("n", "restore", ("scontrol", "update", "NodeName=n", "Weight=1", "Comment="), "").display() == \
        'scontrol update NodeName=n Weight=1 Comment=""'


NOTE = "laggard raised Weight 1->1000001"
# hint action, Slurm Weight, Slurm Comment, expected (verb, argv after NodeName=n) or None, a note that must be printed
WEIGHT_CASES = [
    # avoid: raised by slurm_avoid_weight (1000000), remembered in the Comment; an operator's comment kept.
    ("avoid", "1", None, ("raise", ["Weight=1000001", f"Comment={NOTE}"]), None),
    ("avoid", "1", "(null)", ("raise", ["Weight=1000001", f"Comment={NOTE}"]), None),
    ("avoid", "10", "rack 7, ticket 42", ("raise", ["Weight=1000010", "Comment=rack 7, ticket 42; laggard raised Weight 10->1000010"]), None),
    ("avoid", "1000001", NOTE, None, None),  # raised already: in step
    ("avoid", "1000001", f"rack 7; {NOTE}", None, None),
    # Back at its own weight with the note still there: scontrol reconfigure / a slurmctld restart. Raised again.
    ("avoid", "1", f"rack 7; {NOTE}", ("raise", ["Weight=1000001", f"Comment=rack 7; {NOTE}"]), None),
    # An operator set a weight of their own since: theirs.
    ("avoid", "7", NOTE, None, "node n: hint avoid; Weight 7 set by someone else since laggard raised it 1->1000001: left as is"),
    # Slurm's ceiling.
    ("avoid", "4294967000", None, ("raise", [f"Weight={MAX_WEIGHT}", f"Comment=laggard raised Weight 4294967000->{MAX_WEIGHT}"]), None),
    ("avoid", str(MAX_WEIGHT), None, None, "node n: hint avoid but its Weight 4294967280 is Slurm's largest already: left as is"),
    # Well again (ok, or only rebalance): its weight before, its note gone, the operator's comment kept.
    ("ok", "1000001", NOTE, ("restore", ["Weight=1", "Comment="]), None),
    ("rebalance", "1000010", "rack 7; laggard raised Weight 10->1000010", ("restore", ["Weight=10", "Comment=rack 7"]), None),
    ("ok", "1000001", f"{NOTE}; ticket 9", ("restore", ["Weight=1", "Comment=ticket 9"]), None),
    # Well again, but the weight is not laggard's any more: only the note goes.
    ("ok", "7", f"rack 7; {NOTE}", ("unmark", ["Comment=rack 7"]), None),
    ("ok", "1", NOTE, ("unmark", ["Comment="]), None),  # reconfigured back already
    # Drain keeps the raise (the weight comes back with the resume); no hints: no news is not health.
    ("drain", "1000001", NOTE, None, None),
    (None, "1000001", NOTE, None, "node n: Weight raised by laggard, no hints for it now: left raised"),
    # Never laggard's: left alone whatever the hint.
    ("ok", "1000001", None, None, None),
    ("ok", "5", "laggard was here, says the admin", None, None),
    ("rebalance", "1", None, None, None),
]


@pytest.mark.parametrize(("action", "weight", "comment", "expected", "note"), WEIGHT_CASES)
def test_weight_plan(action, weight, comment, expected, note):
    fields = {"NodeName": "n", "State": "IDLE", "Weight": weight, **({"Comment": comment} if comment is not None else {})}
    doc = hint_doc(("n", action, 0.5, [("clock", "GPU 2 SM clock -49%")])) if action else hint_doc()
    changes, notes = plan({"n": fields}, doc, HintSettings(scontrol_path="scontrol"))
    weight_changes = [(c.verb, list(c.argv[3:])) for c in changes if c.verb in ("raise", "restore", "unmark")]
    assert weight_changes == ([expected[0:1] + (expected[1],)] if expected else [])
    if expected:
        change = next(c for c in changes if c.verb == expected[0])
        assert change.argv[:3] == ("scontrol", "update", "NodeName=n")
    if note:
        assert note in notes


def test_weight_settings():
    fields = {"n": {"NodeName": "n", "State": "IDLE", "Weight": "3"}}
    doc = hint_doc(("n", "rebalance", 0.8, [("clock", "GPU 2 SM clock -12%")]))
    assert plan(fields, doc, HintSettings())[0] == []  # rebalance is not avoid by default
    changes, _ = plan(fields, doc, HintSettings(slurm_avoid_actions=["rebalance", "avoid"], slurm_avoid_weight=100))
    assert [c.argv[3:] for c in changes] == [("Weight=103", "Comment=laggard raised Weight 3->103")]
    doc = hint_doc(("n", "avoid", 0.5, [("clock", "GPU 2 SM clock -49%")]))
    assert plan(fields, doc, HintSettings(slurm_avoid_actions=[]))[0] == []  # the weights left alone


@pytest.mark.parametrize(("comment", "note", "without", "with_note"), [
    ("", None, "", "laggard raised Weight 2->9"),
    (NOTE, (1, 1000001), "", "laggard raised Weight 2->9"),
    (f"rack 7; {NOTE}", (1, 1000001), "rack 7", "rack 7; laggard raised Weight 2->9"),
    (f"{NOTE}; rack 7", (1, 1000001), "rack 7", "rack 7; laggard raised Weight 2->9"),
    (f"a; {NOTE}; b", (1, 1000001), "a; b", "a; b; laggard raised Weight 2->9"),
    ("rack 7", None, "rack 7", "rack 7; laggard raised Weight 2->9"),
])
def test_weight_note_in_the_comment(comment, note, without, with_note):
    assert weight_note(comment) == note
    assert without_weight_note(comment) == without
    assert with_weight_note(comment, 2, 9) == with_note
    assert weight_note(with_note) == (2, 9)


NHC = "NHC: laggard:"
# NHC convention: a reason prefix that starts like NHC's own ("NHC:") and still names laggard.
PREFIX_CASES = [
    # hint action, Slurm state, Slurm reason, expected (verb, argv after NodeName=n) or None
    ("drain", "IDLE", None, ("drain", ["State=DRAIN", "Reason=NHC: laggard: xid: GPU 3 hardware XID 79"])),
    ("ok", "IDLE+DRAIN", "NHC: laggard: xid: GPU 3 hardware XID 79", ("resume", ["State=RESUME"])),
    ("ok", "IDLE+DRAIN", "NHC: check_fs_mount: /scratch not mounted", None),  # NHC's own drain: never laggard's
    ("ok", "IDLE+DRAIN", "NHC:laggard: typed by hand", None),
    ("ok", "IDLE+DRAIN", "laggard: xid: GPU 3", None),  # drained under the old prefix: left for an operator
    ("drain", "IDLE+DRAIN", "NHC: check_gpu: GPU 3 missing", None),
]


@pytest.mark.parametrize(("action", "state", "reason", "expected"), PREFIX_CASES)
def test_nhc_reason_prefix(action, state, reason, expected):
    fields = {"NodeName": "n", "State": state, "Weight": "1", **({"Reason": reason} if reason else {})}
    doc = hint_doc(("n", action, 0.0, [("xid", "GPU 3 hardware XID 79")]))
    changes, notes = plan({"n": fields}, doc, HintSettings(slurm_reason_prefix="NHC:  laggard: "))  # spaces normalised
    assert [(c.verb, list(c.argv[3:])) for c in changes] == ([(expected[0], expected[1])] if expected else [])
    if action == "drain" and reason:
        assert f"node n: hint drain; already drained by someone else ({reason}), left as is" in notes


@pytest.mark.parametrize("prefix", ["NHC:", "", "  ", "admin:", "laggard°:", "laggard\x1b:", "laggard:" + "x" * 60])
def test_reason_prefixes_that_could_take_others_drains_are_refused(prefix):
    with pytest.raises(ValueError):
        HintSettings(slurm_reason_prefix=prefix)


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
        print(f"   State={{n['state']}} ThreadsPerCore=1 TmpDisk=0 Weight={{n.get('weight', 1)}} Owner=N/A MCS_label=N/A")
        print("   Partitions=gpu")
        print("   CfgTRES=cpu=96,mem=2063000M,billing=96,gres/gpu=8")
        if n.get("comment"):  # Slurm prints Comment and Extra only when set
            print(f"   Comment={{n['comment']}}")
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
    node = nodes[name]
    base = node["state"].split("+")[0]
    if kv.get("State") == "DRAIN":
        node.update(state=base + "+DRAIN", reason=kv["Reason"])
    elif kv.get("State") == "RESUME":
        node["state"] = base
        node.pop("reason", None)
    if "Weight" in kv:
        if int(kv["Weight"]) > 4294967280:
            print(f"scontrol: error: Weight value ({{kv['Weight']}}) is greater than 4294967280", file=sys.stderr)
            sys.exit(1)
        node["weight"] = int(kv["Weight"])
    if "Comment" in kv:
        node["comment"] = kv["Comment"]
        if not kv["Comment"]:
            del node["comment"]
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

    def nodes_set(self, name: str, **values) -> None:
        """An operator's change, behind slurm-sync's back."""
        nodes = self.nodes()
        nodes[name].update(values)
        self.state.write_text(json.dumps(nodes))


@pytest.fixture
def scontrol(tmp_path):
    return Scontrol(tmp_path, {
        "gpu-001": {"state": "IDLE"},  # hint drain → drained
        "gpu-002": {"state": "ALLOCATED", "weight": 10, "comment": "rack 7"},  # hint avoid → weight raised, comment kept
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
    assert out[:3] == [
        f'(dry run) {scontrol.path} update NodeName=gpu-001 State=DRAIN Reason="laggard: xid: GPU 3 hardware XID 79 (GPU has fallen off the bus)"',
        f'(dry run) {scontrol.path} update NodeName=gpu-002 Weight=1000010 Comment="rack 7; laggard raised Weight 10->1000010"',
        f"(dry run) {scontrol.path} update NodeName=gpu-004 State=RESUME",
    ]
    assert "node gpu-003: hint drain; already drained by someone else (bad DIMM, ticket 4711), left as is" in out
    assert "node gpu-999: hint drain but Slurm does not know it" in out
    assert out[-1] == "1 to drain, 1 to resume, 1 weight to raise, 0 to restore: planned (dry run; --apply to act)"


def test_apply_drains_and_resumes_only_its_own(scontrol, monkeypatch):
    monkeypatch.setenv("LAGGARD_HINTS__SCONTROL_PATH", str(scontrol.path))  # the setting, not the flag
    with HintsServer(DOC) as hints:
        assert laggard(["slurm-sync", "--server", hints.url, "--apply"]) == 0
        assert scontrol.calls() == [
            ["show", "node"],
            ["update", "NodeName=gpu-001", "State=DRAIN", "Reason=laggard: xid: GPU 3 hardware XID 79 (GPU has fallen off the bus)"],
            ["update", "NodeName=gpu-002", "Weight=1000010", "Comment=rack 7; laggard raised Weight 10->1000010"],
            ["update", "NodeName=gpu-004", "State=RESUME"],
        ]
        nodes = scontrol.nodes()
        assert nodes["gpu-001"] == {"state": "IDLE+DRAIN", "reason": "laggard: xid: GPU 3 hardware XID 79 (GPU has fallen off the bus)"}
        assert nodes["gpu-002"] == {"state": "ALLOCATED", "weight": 1000010, "comment": "rack 7; laggard raised Weight 10->1000010"}
        assert nodes["gpu-003"]["reason"] == "bad DIMM, ticket 4711" and nodes["gpu-004"] == {"state": "IDLE"}

        # Again: in step, only the read.
        assert laggard(["slurm-sync", "--server", hints.url, "--apply"]) == 0
        assert scontrol.calls()[4:] == [["show", "node"]]

        # gpu-001, gpu-002 and gpu-003 healthy: only ours is resumed, gpu-002's weight comes back.
        hints.doc = hint_doc(("gpu-001", "ok", 1.0, []), ("gpu-002", "ok", 1.0, []), ("gpu-003", "ok", 1.0, []))
        assert laggard(["slurm-sync", "--server", hints.url, "--apply"]) == 0
        assert scontrol.calls()[5:] == [["show", "node"], ["update", "NodeName=gpu-001", "State=RESUME"],
                                        ["update", "NodeName=gpu-002", "Weight=10", "Comment=rack 7"]]
        nodes = scontrol.nodes()
        assert nodes["gpu-001"] == {"state": "IDLE"} and nodes["gpu-003"]["state"] == "MIXED+DRAIN"
        assert nodes["gpu-002"] == {"state": "ALLOCATED", "weight": 10, "comment": "rack 7"}


def test_avoid_then_drain_then_ok_across_oneshot_runs(tmp_path, capsys):
    """Each run a new process, as under the systemd timer: what it changed is read back from Slurm."""
    scontrol = Scontrol(tmp_path, {"gpu-001": {"state": "MIXED", "weight": 5}, "gpu-002": {"state": "IDLE", "weight": 5}})
    clock = [("clock", "GPU 2 SM clock -49% vs peers")]

    def sync(*flags: str) -> list[str]:
        assert laggard(["slurm-sync", "--server", hints.url, "--scontrol", str(scontrol.path), "--apply", *flags]) == 0
        return capsys.readouterr().out.splitlines()

    with HintsServer(hint_doc(("gpu-001", "avoid", 0.51, clock), ("gpu-002", "avoid", 0.51, clock))) as hints:
        sync()
        assert {n: (v["weight"], v.get("comment")) for n, v in scontrol.nodes().items()} == {
            "gpu-001": (1000005, "laggard raised Weight 5->1000005"), "gpu-002": (1000005, "laggard raised Weight 5->1000005")}
        # An operator gives gpu-002 a weight of their own; gpu-001 turns into a drain.
        scontrol.nodes_set("gpu-002", weight=50)
        hints.doc = hint_doc(("gpu-001", "drain", 0.0, [("xid", "GPU 2 hardware XID 79")]), ("gpu-002", "avoid", 0.51, clock))
        out = sync()
        assert out[0].endswith("update NodeName=gpu-001 State=DRAIN Reason=\"laggard: xid: GPU 2 hardware XID 79\"")
        assert "node gpu-002: hint avoid; Weight 50 set by someone else since laggard raised it 5->1000005: left as is" in out
        assert out[-1] == "1 to drain, 0 to resume, 0 weights to raise, 0 to restore: done"
        assert scontrol.nodes()["gpu-001"]["weight"] == 1000005  # drained: the raise stays until it is well

        # Both well: gpu-001 resumed and back at 5; gpu-002 keeps the operator's 50, only the note goes.
        hints.doc = hint_doc(("gpu-001", "ok", 1.0, []), ("gpu-002", "ok", 1.0, []))
        out = sync()
        assert [line.split(" update ", 1)[1] for line in out[:3]] == [
            "NodeName=gpu-001 State=RESUME", 'NodeName=gpu-001 Weight=5 Comment=""', 'NodeName=gpu-002 Comment=""']
        assert out[-1] == "0 to drain, 1 to resume, 0 weights to raise, 2 to restore: done"
        assert scontrol.nodes() == {"gpu-001": {"state": "MIXED", "weight": 5}, "gpu-002": {"state": "IDLE", "weight": 50}}
        sync()
        assert scontrol.calls()[-1] == ["show", "node"]  # in step


def test_reason_prefix_flag_and_setting(scontrol, capsys, monkeypatch):
    nhc = {"gpu-001": {"state": "IDLE"}, "gpu-003": {"state": "IDLE+DRAIN", "reason": "NHC: check_fs_mount: /scratch not mounted"},
           "gpu-004": {"state": "IDLE+DRAIN", "reason": "NHC: laggard: thermal: GPU 2 HW slowdown"}}
    scontrol.state.write_text(json.dumps(nhc))
    doc = hint_doc(("gpu-001", "drain", 0.0, [("xid", "GPU 3 hardware XID 79")]), ("gpu-003", "ok", 1.0, []), ("gpu-004", "ok", 1.0, []))
    with HintsServer(doc) as hints:
        base = ["slurm-sync", "--server", hints.url, "--scontrol", str(scontrol.path)]
        assert laggard([*base, "--reason-prefix", "NHC: laggard:"]) == 0
        out = capsys.readouterr().out.splitlines()
        assert [line.split(" update ", 1)[1] for line in out[:2]] == [
            'NodeName=gpu-001 State=DRAIN Reason="NHC: laggard: xid: GPU 3 hardware XID 79"', "NodeName=gpu-004 State=RESUME"]
        assert out[-1].startswith("1 to drain, 1 to resume,")  # gpu-003 is NHC's own: never resumed

        monkeypatch.setenv("LAGGARD_HINTS__SLURM_REASON_PREFIX", "NHC: laggard:")  # the setting does the same
        assert laggard(base) == 0
        assert capsys.readouterr().out.splitlines()[:2] == out[:2]

        # A prefix that would make NHC's (or anyone's) drains look like laggard's is refused, nothing runs.
        calls = len(scontrol.calls())
        assert laggard([*base, "--reason-prefix", "NHC:", "--apply"]) == 2
        assert "must contain 'laggard'" in capsys.readouterr().err
        assert len(scontrol.calls()) == calls


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


def test_the_env_example_names_real_settings(monkeypatch):
    """deploy/slurm/slurm-sync.env.example's commented LAGGARD_HINTS__ lines, uncommented, load."""
    from pathlib import Path

    from server.settings import Settings

    example = Path(__file__).resolve().parents[2] / "deploy" / "slurm" / "slurm-sync.env.example"
    lines = [line[1:] for line in example.read_text().splitlines() if line.startswith("#LAGGARD_HINTS__")]
    assert any(line.startswith("LAGGARD_HINTS__SLURM_REASON_PREFIX=") for line in lines)
    for line in lines:
        key, _, value = line.partition("=")
        monkeypatch.setenv(key, value)
    hints = Settings().hints
    assert (hints.slurm_reason_prefix, hints.slurm_avoid_actions, hints.slurm_avoid_weight) == ("laggard:", ["avoid"], 1_000_000)
