"""agent/workload/attribution.py and node.py: per-GPU workloads from fixture /proc trees under
tmp_path (Kubernetes, Slurm v1/v2, containers, plain processes), a real local pod-list server,
a stand-in scontrol, and the NVML process lists through the real pynvml."""

from __future__ import annotations

import stat

import pytest

from agent.sim.proctree import k8s_path, slurm_path, v1, v2, write_process
from agent.workload import IDLE, Attributor, GpuProcess, KubePods, NodeAttribution, NvmlProcesses, ProcFs, Scontrol, Workload
from agent.workload.node import open_attribution
from tests.agent.pod_server import PodServer, pod
from tests.agent.proc_lib import ProcLib

GIB = 1 << 30
UID_A = "6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b"
UID_B = "11111111-2222-4333-8444-555555555555"
CID_A, CID_B, CID_D = "a" * 64, "b" * 64, "d" * 64
STATIC_HASH = "0f" * 16
SLURM_ENV = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "llama train", "SLURM_JOB_USER": "alice", "SLURM_STEP_ID": "0"}


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def proc(tmp_path):
    return tmp_path / "proc"


@pytest.fixture
def token(tmp_path):
    path = tmp_path / "token"
    path.write_text("t0k3n")
    return path


@pytest.fixture
def api(token):
    pods = [
        pod("llama-70b-workers-0-0", UID_A, namespace="ml", containers={"trainer": CID_A},
            labels={"jobset.sigs.k8s.io/jobset-name": "llama-70b", "batch.kubernetes.io/job-name": "llama-70b-workers-0"}),
        pod("notebook-7f9c", UID_B, namespace="alice", containers={"jupyter": CID_B}, scheme="cri-o",
            labels={"app.kubernetes.io/instance": "alice-notebook"}),
        pod("nvidia-dcgm-gpu-1", "mirror-uid", namespace="kube-system", containers={"dcgm": CID_D},
            annotations={"kubernetes.io/config.mirror": STATIC_HASH}),
    ]
    with PodServer(pods) as server:
        yield server


def _kube(api, token, clock=None) -> KubePods:
    return KubePods(api.pods_url(), token_file=token, background=False, **({"clock": clock} if clock else {}))


# -- /proc reading ------------------------------------------------------------------------

def test_procfs_reads_cgroup_comm_and_only_the_slurm_variables(proc):
    write_process(proc, 4711, cgroup=v2(slurm_path(4242, 0)), comm="python3.11-long-name", environ=SLURM_ENV)
    fs = ProcFs(proc)
    assert fs.cgroup(4711) == "0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n"
    assert fs.comm(4711) == "python3.11-long"  # the kernel keeps 15 bytes
    assert fs.environ(4711) == SLURM_ENV  # PATH and HOME not decoded
    with pytest.raises(FileNotFoundError):
        fs.cgroup(4712)


# -- Kubernetes -----------------------------------------------------------------------------

@pytest.mark.parametrize("driver, qos, runtime, cgroup_version", [
    ("systemd", "burstable", "containerd", 2),
    ("systemd", "guaranteed", "cri-o", 2),
    ("cgroupfs", "besteffort", "containerd", 1),
    ("cgroupfs", "burstable", "cri-o", 1),
    ("systemd", "besteffort", "docker", 1),
])
def test_k8s_pod_job_and_container(proc, api, token, driver, qos, runtime, cgroup_version):
    path = k8s_path(UID_A, CID_A, qos=qos, driver=driver, runtime=runtime)
    write_process(proc, 100, cgroup=v2(path) if cgroup_version == 2 else v1(path), comm="torchrun")
    pods = _kube(api, token)
    att = Attributor(ProcFs(proc), pods=pods)
    [w] = att.attribute([[GpuProcess(100, 70 * GIB)]])
    assert w == Workload(kind="k8s", job="llama-70b", namespace="ml", pod="llama-70b-workers-0-0", pod_uid=UID_A, container="trainer",
                         container_id=CID_A, process="torchrun", pid=100, processes=1, workloads=1)
    assert sum(att.counters().values()) == 0
    pods.close()


def test_a_shared_gpu_goes_to_the_workload_holding_most_memory(proc, api, token):
    write_process(proc, 100, cgroup=v2(k8s_path(UID_A, CID_A)), comm="python")
    write_process(proc, 101, cgroup=v2(k8s_path(UID_A, CID_A)), comm="python")
    write_process(proc, 200, cgroup=v2(k8s_path(UID_B, CID_B, runtime="cri-o")), comm="jupyter-lab")
    pods = _kube(api, token)
    att = Attributor(ProcFs(proc), pods=pods)
    # pod B's one process holds more than either of A's, but A holds more in all
    a, b = att.attribute([[GpuProcess(100, 10 * GIB), GpuProcess(101, 10 * GIB), GpuProcess(200, 15 * GIB)],
                          [GpuProcess(100, 1 * GIB), GpuProcess(200, 15 * GIB)]])
    assert (a.pod, a.pid, a.processes, a.workloads) == ("llama-70b-workers-0-0", 100, 3, 2)
    assert (b.pod, b.job, b.container, b.pid, b.processes, b.workloads) == ("notebook-7f9c", "alice-notebook", "jupyter", 200, 2, 2)
    pods.close()


def test_static_pod_found_by_its_mirror_annotation(proc, api, token):
    write_process(proc, 300, cgroup=v2(k8s_path(STATIC_HASH, CID_D, qos="besteffort")), comm="nv-hostengine")
    pods = _kube(api, token)
    [w] = Attributor(ProcFs(proc), pods=pods).attribute([[300]])
    assert (w.kind, w.namespace, w.pod, w.container, w.pod_uid) == ("k8s", "kube-system", "nvidia-dcgm-gpu-1", "dcgm", "mirror-uid")
    pods.close()


def test_api_server_down_leaves_pod_fields_null_and_counts(proc, api, token):
    write_process(proc, 100, cgroup=v2(k8s_path(UID_A, CID_A)), comm="python")
    api.status = 503
    pods = _kube(api, token)
    att = Attributor(ProcFs(proc), pods=pods)
    [w] = att.attribute([[GpuProcess(100, GIB)]])
    assert w == Workload(kind="k8s", pod_uid=UID_A, container_id=CID_A, process="python", pid=100, processes=1, workloads=1)
    assert att.counters() == {"proc_unreadable": 0, "environ_unreadable": 0, "attribution_failed": 0,
                              "k8s_list_failed": 1, "k8s_pod_unknown": 1}
    pods.close()


def test_k8s_without_a_pod_lookup_still_gives_the_uid(proc):
    write_process(proc, 100, cgroup=v2(k8s_path(UID_A, CID_A)))
    [w] = Attributor(ProcFs(proc)).attribute([[100]])
    assert (w.kind, w.pod_uid, w.pod, w.container_id) == ("k8s", UID_A, None, CID_A)


# -- Slurm ------------------------------------------------------------------------------------

def _scontrol(tmp_path, line: str) -> str:
    script = tmp_path / "scontrol"
    script.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/calls\nprintf '%s\\n' '{line}'\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


@pytest.mark.parametrize("version", [1, 2])
def test_slurm_from_cgroup_named_by_environ(proc, version):
    path = slurm_path(4242, 0, version=version)
    write_process(proc, 500, cgroup=v2(path) if version == 2 else v1(path, systemd="/system.slice/slurmd.service"),
                  comm="python", environ=SLURM_ENV)
    att = Attributor(ProcFs(proc))
    [w] = att.attribute([[GpuProcess(500, 40 * GIB)]])
    assert w == Workload(kind="slurm", job="llama train", slurm_job_id="4242", slurm_step="0", user="alice", process="python", pid=500,
                         processes=1, workloads=1)


def test_slurm_environ_unreadable_named_by_scontrol(tmp_path, proc):
    write_process(proc, 501, cgroup=v1(slurm_path(77, "batch", version=1)), comm="python")
    (proc / "501" / "environ").unlink()
    (proc / "501" / "environ").mkdir()  # reading it fails (EISDIR), as for another user's process without CAP_SYS_PTRACE
    sc = Scontrol(_scontrol(tmp_path, "JobId=77 JobName=sweep UserId=bob(1001) GroupId=ml(2000) JobState=RUNNING"), background=False)
    att = Attributor(ProcFs(proc), slurm=sc)
    [w] = att.attribute([[501]])
    assert (w.kind, w.job, w.user, w.slurm_job_id, w.slurm_step) == ("slurm", "sweep", "bob", "77", "batch")
    att.attribute([[501]])
    assert (tmp_path / "calls").read_text() == "-o show job 77\n"  # once per job
    assert att.counters() == {"proc_unreadable": 0, "environ_unreadable": 1, "attribution_failed": 0, "scontrol_failed": 0}


def test_slurm_environ_of_another_job_is_not_believed(proc):
    # an ssh session adopted into job 88 by pam_slurm_adopt, carrying job 4242's variables
    write_process(proc, 502, cgroup=v2(slurm_path(88, "extern")), comm="python", environ=SLURM_ENV)
    [w] = Attributor(ProcFs(proc)).attribute([[502]])
    assert (w.kind, w.slurm_job_id, w.slurm_step, w.job, w.user) == ("slurm", "88", "extern", None, None)


def test_slurm_without_a_cgroup_plugin_from_environ_alone(proc):
    write_process(proc, 503, cgroup=v2("/system.slice/slurmd.service"), comm="a.out", environ=SLURM_ENV)
    [w] = Attributor(ProcFs(proc)).attribute([[503]])
    assert (w.kind, w.slurm_job_id, w.slurm_step, w.job, w.user) == ("slurm", "4242", "0", "llama train", "alice")


# -- containers, processes, idle, failures -----------------------------------------------------

def test_plain_container_and_plain_process(proc):
    write_process(proc, 600, cgroup=v2(f"/system.slice/docker-{CID_B}.scope"), comm="python")
    write_process(proc, 601, cgroup=v2("/user.slice/user-1000.slice/session-3.scope"), comm="blender")
    a, b, idle, unknown = Attributor(ProcFs(proc)).attribute([[600], [601], [], None])
    assert a == Workload(kind="process", container_id=CID_B, process="python", pid=600, processes=1, workloads=1)
    assert b == Workload(kind="process", process="blender", pid=601, processes=1, workloads=1)
    assert idle is IDLE and idle.kind is None and unknown is None


def test_a_pid_we_cannot_see_leaves_fields_null_and_is_counted_every_time(proc):
    proc.mkdir()
    att = Attributor(ProcFs(proc))
    for _ in range(2):
        [w] = att.attribute([[GpuProcess(999, GIB)]])
        assert w == Workload(kind="process", pid=999, processes=1, workloads=1)
    assert att.errors["proc_unreadable"] == 2 and att.cached_pids == 0


def test_dominance_ties(proc):
    write_process(proc, 10, cgroup=v2("/user.slice/a.scope"), comm="a")
    write_process(proc, 20, cgroup=v2(f"/docker/{CID_B}"), comm="b")
    write_process(proc, 21, cgroup=v2(f"/docker/{CID_B}"), comm="b2")
    write_process(proc, 30, cgroup=v2(slurm_path(5, 0)), comm="c")
    att = Attributor(ProcFs(proc))
    # memory unknown: most processes wins (the container's two)
    assert att.attribute([[10, 20, 21]])[0].container_id == CID_B
    # equal memory and count: a Slurm job (or pod) beats a bare process
    assert att.attribute([[GpuProcess(10, GIB), GpuProcess(30, GIB)]])[0].slurm_job_id == "5"
    # all equal: the lowest PID
    assert att.attribute([[GpuProcess(21, GIB), GpuProcess(10, GIB)]])[0].pid == 10
    # within the dominant workload the process holding most memory speaks for it
    assert att.attribute([[GpuProcess(20, GIB), GpuProcess(21, 2 * GIB)]])[0].process == "b2"


def test_per_pid_cache_revalidates_and_forgets_pids_no_gpu_lists(proc):
    clock = Clock()
    write_process(proc, 700, cgroup=v2(slurm_path(1, 0)), comm="python")
    write_process(proc, 701, cgroup=v2("/user.slice/x.scope"), comm="tool")
    att = Attributor(ProcFs(proc), revalidate_s=30, clock=clock)
    assert att.attribute([[700], [700, 701]])[0].slurm_job_id == "1"
    assert att.cached_pids == 2
    (proc / "700" / "cgroup").write_text(v2(slurm_path(2, 0)))  # moved (pam_slurm_adopt, systemd)
    clock.t += 10
    assert att.attribute([[700], [700]])[0].slurm_job_id == "1"  # cached
    assert att.cached_pids == 1  # 701 listed by no GPU: forgotten
    clock.t += 30
    assert att.attribute([[700], []])[0].slurm_job_id == "2"  # re-read after revalidate_s
    assert att.attribute([[], [700]])[1].slurm_job_id == "2"  # moved GPU: still listed somewhere, still cached
    assert att.cached_pids == 1
    att.attribute([[], []])
    assert att.cached_pids == 0
    att.attribute_gpu(0, [700])
    assert att.attribute_gpu(0, None) is None and att.cached_pids == 0  # a GPU that cannot say lists nothing


class _Broken(ProcFs):
    def cgroup(self, pid: int) -> str:
        raise ValueError("a bug")


def test_a_bug_costs_that_gpu_only_and_is_counted(proc):
    write_process(proc, 800, cgroup=v2("/user.slice/x.scope"), comm="ok")
    att = Attributor(_Broken(proc))
    assert att.attribute([[800], []]) == [None, IDLE]
    assert att.errors["attribution_failed"] == 1


# -- the entry point: NVML handles in, workloads out -------------------------------------------

def test_node_attribution_through_pynvml(install, proc, api, token):
    lib = install(ProcLib())
    write_process(proc, 100, cgroup=v2(k8s_path(UID_A, CID_A)), comm="torchrun")
    write_process(proc, 500, cgroup=v2(slurm_path(4242, 0)), comm="python", environ=SLURM_ENV)
    lib.procs[(1, "compute")] = [(100, 60 * GIB)]
    lib.procs[(2, "compute")] = [(500, 10 * GIB)]
    lib.procs[(2, "graphics")] = [(500, 10 * GIB)]
    lib.errors[(3, "compute")] = lib.errors[(3, "graphics")] = lib.errors[(3, "mps")] = 4  # NVML_ERROR_NO_PERMISSION
    node = NodeAttribution(Attributor(ProcFs(proc), pods=_kube(api, token)), NvmlProcesses())
    try:
        k8s, slurm, unknown, idle, lost = node.read([1, 2, 3, 4, None])
        assert (k8s.kind, k8s.pod, k8s.job, k8s.container) == ("k8s", "llama-70b-workers-0-0", "llama-70b", "trainer")
        assert (slurm.kind, slurm.slurm_job_id, slurm.processes) == ("slurm", "4242", 1)
        assert unknown is None and idle is IDLE and lost is None
        assert node.read_gpu(0, 1).pod == "llama-70b-workers-0-0"
        counters = node.counters()
        assert counters["nvml_no_permission"] == 1 and sum(counters.values()) == 1
    finally:
        node.close()


def test_open_attribution_settings(tmp_path, api, token):
    plain = open_attribution(proc_root=str(tmp_path), node="gpu-1", env={})
    assert plain.attributor.pods is None and plain.attributor.slurm is None and plain.attributor.proc.root == str(tmp_path)
    inside = open_attribution(node="gpu-1", env={"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"},
                              scontrol="/usr/bin/scontrol")
    assert inside.attributor.pods.url == "https://10.96.0.1:443/api/v1/pods?fieldSelector=spec.nodeName%3Dgpu-1&resourceVersion=0"
    assert inside.attributor.slurm.binary == "/usr/bin/scontrol"
    off = open_attribution(node="gpu-1", kubernetes="off", env={"KUBERNETES_SERVICE_HOST": "10.96.0.1"})
    assert off.attributor.pods is None
    explicit = open_attribution(pods_url=api.pods_url(), token_file=str(token), env={})
    assert explicit.attributor.pods.url == api.pods_url()
    for n in (plain, inside, off, explicit):
        n.close()
