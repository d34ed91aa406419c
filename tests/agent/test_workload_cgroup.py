"""agent/workload/cgroup.py: cgroup paths as nodes show them → pod UID, QoS, container id and
runtime, Slurm job/step; one row per runtime × driver × QoS × cgroup version, Slurm layouts,
plain containers, and paths that name nothing."""

from __future__ import annotations

import pytest

from agent.workload.cgroup import NOTHING, CgroupMatch, classify_cgroup_file, classify_path, parse_cgroup_file

UID = "6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b"
UID_ = UID.replace("-", "_")
CID = "3b8f2e1d9c7a6b5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e"
STATIC = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"  # a static pod's config hash

K8S = [
    # systemd driver, cgroup v2 (containerd, CRI-O, Docker via cri-dockerd), each QoS class
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope", "burstable", "containerd"),
    (f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope", "besteffort", "containerd"),
    (f"/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope", "guaranteed", "containerd"),
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-{CID}.scope", "burstable", "cri-o"),
    (f"/kubepods.slice/kubepods-pod{UID_}.slice/crio-{CID}.scope", "guaranteed", "cri-o"),
    (f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/docker-{CID}.scope", "besteffort", "docker"),
    # cgroupfs driver: containerd (bare id), CRI-O (crio-<id>), Docker (bare id)
    (f"/kubepods/burstable/pod{UID}/{CID}", "burstable", None),
    (f"/kubepods/besteffort/pod{UID}/{CID}", "besteffort", None),
    (f"/kubepods/pod{UID}/{CID}", "guaranteed", None),
    (f"/kubepods/burstable/pod{UID}/crio-{CID}", "burstable", "cri-o"),
    (f"/kubepods/pod{UID}/crio-{CID}", "guaranteed", "cri-o"),
    # kind / kubelet with --cgroup-root (nested slice names)
    (f"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{UID_}.slice/"
     f"cri-containerd-{CID}.scope", "besteffort", "containerd"),
    (f"/kubelet/kubepods/burstable/pod{UID}/{CID}", "burstable", None),
    # seen from inside the agent's own cgroup namespace
    (f"/../../kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope", "burstable", "containerd"),
    (f"/../kubepods-pod{UID_}.slice/crio-{CID}.scope", "guaranteed", "cri-o"),
]


@pytest.mark.parametrize("path, qos, runtime", K8S)
def test_kubernetes_paths(path, qos, runtime):
    assert classify_path(path) == CgroupMatch(pod_uid=UID, qos=qos, container_id=CID, runtime=runtime)


@pytest.mark.parametrize("path, qos", [
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice", "burstable"),  # the pod, no container
    (f"/kubepods/besteffort/pod{UID}", "besteffort"),
    (f"/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope/init", "guaranteed"),  # a sub-cgroup of the container
])
def test_pod_level_and_nested_paths(path, qos):
    m = classify_path(path)
    assert (m.pod_uid, m.qos) == (UID, qos)


def test_static_pod_config_hash_as_uid():
    path = f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{STATIC}.slice/cri-containerd-{CID}.scope"
    assert classify_path(path).pod_uid == STATIC
    assert classify_path(f"/kubepods/burstable/pod{STATIC}/{CID}").pod_uid == STATIC


SLURM = [
    # cgroup v2 (cgroup/v2 plugin): job_<id>/step_<id>/user/task_<n>
    ("/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0", "4242", "0", None),
    ("/system.slice/slurmstepd.scope/job_4242/step_3/user/task_7", "4242", "3", None),
    ("/system.slice/slurmstepd.scope/job_4242/step_batch/user/task_0", "4242", "batch", None),
    ("/system.slice/slurmstepd.scope/job_4242/step_extern/user/task_special", "4242", "extern", None),  # pam_slurm_adopt
    ("/system.slice/slurmstepd.scope/job_4242/step_interactive/user/task_0", "4242", "interactive", None),
    ("/system.slice/gpu-node-07_slurmstepd.scope/job_4242/step_0/user/task_0", "4242", "0", None),  # multiple slurmd
    ("/../../system.slice/slurmstepd.scope/job_4242/step_0/user/task_0", "4242", "0", None),  # through a cgroup namespace
    ("/system.slice/slurmstepd.scope/job_4242/step_0/slurm", "4242", "0", None),  # the step's own slurmstepd
    # cgroup v1 (task/cgroup, proctrack/cgroup): slurm/uid_<uid>/job_<id>/step_<id>/task_<n>
    ("/slurm/uid_1000/job_4242/step_0/task_0", "4242", "0", 1000),
    ("/slurm/uid_1000/job_4242/step_0", "4242", "0", 1000),
    ("/slurm/uid_1000/job_4242/step_batch/task_0", "4242", "batch", 1000),
    ("/slurm/uid_1000/job_4242/step_extern", "4242", "extern", 1000),
    ("/slurm_gpu-node-07/uid_1000/job_4242/step_1/task_0", "4242", "1", 1000),  # per-node slurmd cgroup
    ("/slurm/uid_1000/job_4242", "4242", None, 1000),  # the job level
]


@pytest.mark.parametrize("path, job, step, uid", SLURM)
def test_slurm_paths(path, job, step, uid):
    assert classify_path(path) == CgroupMatch(slurm_job_id=job, slurm_step=step, slurm_uid=uid)


CONTAINERS = [
    (f"/system.slice/docker-{CID}.scope", "docker"),  # Docker, systemd driver
    (f"/docker/{CID}", "docker"),  # Docker, cgroupfs driver
    (f"/../docker/{CID}", "docker"),
    (f"/machine.slice/libpod-{CID}.scope", "podman"),
    (f"/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{CID}.scope/container", "podman"),  # rootless
    (f"/system.slice/nerdctl-{CID}.scope", "containerd"),
    (f"/system.slice/crio-{CID}.scope", "cri-o"),
    (f"/docker/{'a' * 64}/docker/{CID}", "docker"),  # docker in docker: the inner one
]


@pytest.mark.parametrize("path, runtime", CONTAINERS)
def test_plain_containers(path, runtime):
    assert classify_path(path) == CgroupMatch(container_id=CID, runtime=runtime)


@pytest.mark.parametrize("path", [
    "/", "", "/user.slice/user-1000.slice/session-3.scope", "/system.slice/slurmd.service",
    "/system.slice/slurmstepd.scope/system",  # slurmstepd itself, no job
    "/system.slice/sshd.service", "/init.scope",
    "/kubepods.slice/kubepods-burstable.slice",  # the QoS level, no pod
    f"/system.slice/docker-{CID[:12]}.scope",  # not a full id
    "/batch/job_12/step_0",  # job_ without a slurm segment: not trusted
    f"/user.slice/pod{UID}",  # pod<uid> outside kubepods
])
def test_paths_that_name_nothing(path):
    assert classify_path(path) == NOTHING


def test_parse_cgroup_file_v1_v2_and_hybrid():
    text = f"12:memory:/kubepods/burstable/pod{UID}/{CID}\n1:name=systemd:/system.slice/containerd.service\n0::/\n"
    assert parse_cgroup_file(text) == [("memory", f"/kubepods/burstable/pod{UID}/{CID}"),
                                       ("name=systemd", "/system.slice/containerd.service"), ("", "/")]
    assert parse_cgroup_file("garbage\n\n0::/x\n") == [("", "/x")]


@pytest.mark.parametrize("text, expected", [
    # cgroup v2: one line
    (f"0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope\n", CgroupMatch(UID, "guaranteed", CID, "containerd")),
    # cgroup v1, cgroupfs driver: every controller agrees
    ("\n".join(f"{i}:{c}:/kubepods/besteffort/pod{UID}/{CID}" for i, c in enumerate(["cpu,cpuacct", "memory", "devices", "pids"], 2))
     + "\n1:name=systemd:/kubepods/besteffort/pod" + UID + "/" + CID + "\n", CgroupMatch(UID, "besteffort", CID, None)),
    # hybrid: the unified line is "/", the v1 lines carry the pod
    (f"0::/\n11:devices:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-{CID}.scope\n"
     "1:name=systemd:/system.slice/crio.service\n", CgroupMatch(UID, "burstable", CID, "cri-o")),
    # Slurm v1: only the plugin's controllers carry the job, name=systemd says slurmd
    ("12:pids:/system.slice/slurmd.service\n10:freezer:/slurm/uid_1000/job_77/step_0/task_0\n"
     "7:memory:/slurm/uid_1000/job_77/step_0/task_0\n4:devices:/slurm/uid_1000/job_77/step_0\n"
     "1:name=systemd:/system.slice/slurmd.service\n0::/system.slice/slurmd.service\n",
     CgroupMatch(slurm_job_id="77", slurm_step="0", slurm_uid=1000)),
    # Slurm v1 where one controller has only the job level: the step-level line wins
    ("5:cpuset:/slurm/uid_1000/job_77\n4:memory:/slurm/uid_1000/job_77/step_batch/task_0\n",
     CgroupMatch(slurm_job_id="77", slurm_step="batch", slurm_uid=1000)),
    ("0::/user.slice/user-1000.slice/session-4.scope\n", NOTHING),
    ("", NOTHING),
])
def test_classify_cgroup_file_picks_the_most_telling_line(text, expected):
    assert classify_cgroup_file(text) == expected
