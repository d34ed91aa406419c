"""agent/workload/slurm.py: Slurm job from a process's environment, `scontrol -o show job` output
parsed, and Scontrol running a stand-in scontrol binary (cache, retry interval, failures)."""

from __future__ import annotations

import os
import stat

import pytest

from agent.workload.slurm import Scontrol, SlurmJob, job_from_environ, job_from_show, parse_show_job

SHOW_JOB = (
    "JobId=4242 JobName=llama train UserId=alice(1000) GroupId=alice(1000) MCS_label=N/A Priority=4294901757 Nice=0 "
    "Account=ml QOS=normal JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 "
    "ExitCode=0:0 RunTime=00:12:31 TimeLimit=2-00:00:00 TimeMin=N/A SubmitTime=2025-01-01T10:00:00 "
    "EligibleTime=2025-01-01T10:00:00 AccrueTime=2025-01-01T10:00:00 StartTime=2025-01-01T10:00:05 "
    "EndTime=2025-01-03T10:00:05 Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2025-01-01T10:00:05 "
    "Scheduler=Main Partition=gpu AllocNode:Sid=login-1:12345 ReqNodeList=(null) ExcNodeList=(null) "
    "NodeList=gpu-node-[07-08] BatchHost=gpu-node-07 NumNodes=2 NumCPUs=128 NumTasks=16 CPUs/Task=8 "
    "ReqB:S:C:T=0:0:*:* ReqTRES=cpu=128,mem=1000G,node=2,billing=128,gres/gpu=16 "
    "AllocTRES=cpu=128,mem=1000G,node=2,billing=128,gres/gpu=16 Socks/Node=* NtasksPerN:B:S:C=8:0:*:* CoreSpec=* "
    "MinCPUsNode=64 MinMemoryNode=500G MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=NO "
    "Contiguous=0 Licenses=(null) Network=(null) Command=/home/alice/train.sh WorkDir=/home/alice "
    "StdErr=/home/alice/slurm-4242.out StdIn=/dev/null StdOut=/home/alice/slurm-4242.out Power= TresPerNode=gres/gpu:8\n"
)
ARRAY_JOB = ("JobId=5003 ArrayJobId=5000 ArrayTaskId=3 JobName=sweep UserId=bob(1001) GroupId=ml(2000) MCS_label=N/A "
             "JobState=RUNNING Partition=gpu NodeList=gpu-node-09 TRES=cpu=8,mem=64G,node=1,gres/gpu=1\n")


def test_parse_show_job_keeps_spaces_in_names_and_equals_in_values():
    fields = parse_show_job(SHOW_JOB)
    assert fields["JobId"] == "4242" and fields["JobName"] == "llama train" and fields["UserId"] == "alice(1000)"
    assert fields["AllocTRES"] == "cpu=128,mem=1000G,node=2,billing=128,gres/gpu=16"
    assert fields["AllocNode:Sid"] == "login-1:12345" and fields["NtasksPerN:B:S:C"] == "8:0:*:*"
    assert fields["Socks/Node"] == "*" and fields["Power"] == "" and fields["TresPerNode"] == "gres/gpu:8"


@pytest.mark.parametrize("text, job", [
    (SHOW_JOB, SlurmJob("4242", "llama train", "alice")),
    (ARRAY_JOB, SlurmJob("5003", "sweep", "bob")),
    ("JobId=7 JobName= UserId=(4294967294)\n", SlurmJob("7", None, None)),
    ("slurm_load_jobs error: Invalid job id specified\n", None),
    ("", None),
])
def test_job_from_show(text, job):
    assert job_from_show(text) == job


@pytest.mark.parametrize("env, job, step", [
    ({"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "llama train", "SLURM_JOB_USER": "alice", "SLURM_STEP_ID": "0"},
     SlurmJob("4242", "llama train", "alice"), "0"),
    ({"SLURM_JOB_ID": "4242"}, SlurmJob("4242"), None),
    ({"SLURM_JOB_NAME": "x"}, None, None),
    ({}, None, None),
])
def test_job_from_environ(env, job, step):
    assert job_from_environ(env) == (job, step)


def _fake_scontrol(tmp_path, jobs: dict[str, str]) -> str:
    """An executable that answers `scontrol -o show job <id>` like the real one, logging its arguments."""
    script = tmp_path / "scontrol"
    cases = "\n".join(f"  {jid}) printf '%s' '{text}' ;;" for jid, text in jobs.items())
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {tmp_path}/calls\n'
        '[ "$1 $2 $3" = "-o show job" ] || { echo "bad args" >&2; exit 2; }\n'
        'case "$4" in\n'
        f"{cases}\n"
        '  *) echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1 ;;\n'
        "esac\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


class Clock:
    def __init__(self) -> None:
        self.t = 50.0

    def __call__(self) -> float:
        return self.t


def test_scontrol_asks_once_per_job_and_retries_a_failure_after_retry_s(tmp_path):
    clock = Clock()
    sc = Scontrol(_fake_scontrol(tmp_path, {"4242": SHOW_JOB.strip()}), clock=clock, background=False, retry_s=60)
    assert sc.lookup("4242") == SlurmJob("4242", "llama train", "alice")
    assert sc.lookup("4242") == SlurmJob("4242", "llama train", "alice")
    assert sc.lookup("999") is None  # unknown: counted
    clock.t += 30
    assert sc.lookup("999") is None  # not asked again yet
    clock.t += 30
    assert sc.lookup("999") is None  # asked again: still unknown
    assert (tmp_path / "calls").read_text().splitlines() == ["-o show job 4242", "-o show job 999", "-o show job 999"]
    assert sc.errors == {"scontrol_failed": 2} and sc.runs == 3


def test_scontrol_missing_binary_and_timeout_are_counted(tmp_path):
    sc = Scontrol(str(tmp_path / "nope"), background=False)
    assert sc.lookup("1") is None and sc.errors == {"scontrol_failed": 1}
    slow = tmp_path / "slow"
    slow.write_text("#!/bin/sh\nsleep 5\n")
    slow.chmod(0o755)
    sc = Scontrol(str(slow), background=False, timeout_s=0.2)
    assert sc.lookup("1") is None and sc.errors == {"scontrol_failed": 1}


def test_scontrol_in_the_background(tmp_path):
    sc = Scontrol(_fake_scontrol(tmp_path, {"5003": ARRAY_JOB.strip()}))
    try:
        sc.lookup("5003")
        assert sc.wait_idle(10)
        assert sc.lookup("5003") == SlurmJob("5003", "sweep", "bob")
    finally:
        sc.close()
    assert os.path.exists(tmp_path / "calls")
