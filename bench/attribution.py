"""CPU cost of GPU → workload attribution (agent/workload) per sampling cycle.

A fixture /proc tree in a temporary directory (agent/sim/proctree.py) with 8 GPUs × N
processes, for one scenario:

  k8s    per GPU: a training pod's 2 processes (most memory), a second pod's process, a plain
         process (N=4); pod names from a local PodList server (40 pods on the node)
  slurm  per GPU: N processes of one Slurm job step (cgroup v2) with SLURM_* in environ
  mixed  GPUs alternate between the two

Each timed call is what the agent would do once per sample at 1 Hz: Attributor.attribute over
all 8 GPUs' process lists. Reported, in microseconds per call:

  warm        steady state: every PID cached (what nearly every call costs)
  cold        a fresh Attributor each call: every PID's cgroup/comm/environ read and parsed
  amortised   warm + cold / revalidate_s (each PID's files are re-read every revalidate_s)
  nvml lists  NvmlProcesses over the 8 GPUs through the real pynvml, on a fake library that
              answers in-process (pynvml's marshalling and decoding; not the driver's own time)

and as % of one core at 1 Hz (µs per call / 10^4). Target context: the whole agent ≤ 0.5 % of
a core at 1 Hz × 8 GPUs, i.e. ≤ 5 ms per second, attribution on.

    python bench/attribution.py --scenario k8s --calls 2000
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.sim.install import install_simulated_nvml  # noqa: E402
from agent.sim.proctree import k8s_path, slurm_path, v2, write_process  # noqa: E402
from agent.workload import Attributor, GpuProcess, KubePods, NvmlProcesses, ProcFs  # noqa: E402
from tests.agent.pod_server import PodServer, pod  # noqa: E402
from tests.agent.proc_lib import ProcLib  # noqa: E402

GPUS = 8
GIB = 1 << 30


def _uid(i: int) -> str:
    return f"{i:08x}-1111-4222-8333-{i:012x}"


def _cid(i: int) -> str:
    return f"{i:064x}"


def build(root: Path, scenario: str, per_gpu: int) -> tuple[list[list[GpuProcess]], list[dict]]:
    """Write the tree; (per-GPU process lists, the node's pods)."""
    procs: list[list[GpuProcess]] = []
    pods = [pod(f"other-{i}", _uid(1000 + i), namespace="kube-system", containers={"c": _cid(1000 + i)}) for i in range(40 - 2 * GPUS)]
    pid = 10_000
    for g in range(GPUS):
        gpu: list[GpuProcess] = []
        kind = scenario if scenario != "mixed" else ("k8s" if g % 2 == 0 else "slurm")
        if kind == "k8s":
            train, other = _uid(g), _uid(100 + g)
            pods.append(pod(f"llama-workers-0-{g}", train, namespace="ml", containers={"trainer": _cid(g)},
                            labels={"jobset.sigs.k8s.io/jobset-name": "llama", "batch.kubernetes.io/job-name": "llama-workers-0"}))
            pods.append(pod(f"notebook-{g}", other, namespace="dev", containers={"jupyter": _cid(100 + g)}, scheme="cri-o"))
            for j in range(per_gpu):
                pid += 1
                if j < max(1, per_gpu - 2):
                    cg, used = k8s_path(train, _cid(g)), 30 * GIB
                elif j == per_gpu - 2:
                    cg, used = k8s_path(other, _cid(100 + g), qos="besteffort", runtime="cri-o"), 2 * GIB
                else:
                    cg, used = "/user.slice/user-0.slice/session-1.scope", GIB // 2
                write_process(root, pid, cgroup=v2(cg), comm="python3")
                gpu.append(GpuProcess(pid, used))
        else:
            for j in range(per_gpu):
                pid += 1
                env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "llama", "SLURM_JOB_USER": "alice", "SLURM_STEP_ID": "0",
                       **{f"VAR_{k}": "x" * 40 for k in range(60)}}  # a realistic ~3 KiB environment
                write_process(root, pid, cgroup=v2(slurm_path(4242, 0, task=g * per_gpu + j)), comm="python3", environ=env)
                gpu.append(GpuProcess(pid, 20 * GIB))
        procs.append(gpu)
    return procs, pods


def _time(fn, calls: int) -> tuple[float, float, float]:
    """(median µs per call, p99 µs, CPU µs per call) over `calls` calls."""
    samples = []
    cpu0 = time.process_time()
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    cpu = (time.process_time() - cpu0) * 1e6 / calls
    samples.sort()
    return statistics.median(samples), samples[min(len(samples) - 1, int(len(samples) * 0.99))], cpu


def run(scenario: str, per_gpu: int, calls: int, revalidate_s: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "proc"
        per_gpu_procs, pods = build(root, scenario, per_gpu)
        token = Path(tmp) / "token"
        token.write_text("t0k3n")
        with PodServer(pods) as server:
            kube = KubePods(server.pods_url(), token_file=token, background=False)
            t0 = time.perf_counter()
            assert kube.relist()
            list_ms = (time.perf_counter() - t0) * 1e3
            fs = ProcFs(root)
            att = Attributor(fs, pods=kube, revalidate_s=revalidate_s)
            first = att.attribute(per_gpu_procs)
            assert all(w is not None and w.kind in ("k8s", "slurm") for w in first), first
            warm = _time(lambda: att.attribute(per_gpu_procs), calls)
            cold = _time(lambda: Attributor(fs, pods=kube).attribute(per_gpu_procs), max(50, calls // 10))
            counters = att.counters()
            kube.close()
        lib = ProcLib()
        for g, gpu in enumerate(per_gpu_procs, start=1):
            lib.procs[(g, "compute")] = [(p.pid, p.used_bytes) for p in gpu]
        with install_simulated_nvml(lib):
            lister = NvmlProcesses()
            handles = list(range(1, GPUS + 1))
            assert lister.read_all(handles)[0]
            nvml = _time(lambda: lister.read_all(handles), calls)
    amortised = warm[2] + cold[2] / revalidate_s
    return {
        "scenario": scenario, "gpus": GPUS, "processes_per_gpu": per_gpu, "calls": calls,
        "warm_us": {"median": round(warm[0], 1), "p99": round(warm[1], 1), "cpu": round(warm[2], 1)},
        "cold_us": {"median": round(cold[0], 1), "p99": round(cold[1], 1), "cpu": round(cold[2], 1)},
        "amortised_cpu_us": round(amortised, 1),
        "nvml_lists_us": {"median": round(nvml[0], 1), "p99": round(nvml[1], 1), "cpu": round(nvml[2], 1)},
        "pct_core_at_1hz": round((amortised + nvml[2]) / 1e4, 4),
        "pod_list_ms": round(list_ms, 2), "pods_on_node": len(pods),
        "failures": {k: v for k, v in counters.items() if v},
        "example": {k: v for k, v in vars_of(first[0]).items() if v is not None},
    }


def vars_of(obj) -> dict:
    return {name: getattr(obj, name) for name in obj.__slots__}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", choices=["k8s", "slurm", "mixed", "all"], default="all")
    p.add_argument("--processes", type=int, default=4, help="processes per GPU (default 4)")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--revalidate-s", type=float, default=30.0)
    p.add_argument("--json", metavar="PATH", help="also write the results here")
    args = p.parse_args(argv)
    scenarios = ["k8s", "slurm", "mixed"] if args.scenario == "all" else [args.scenario]
    results = [run(s, args.processes, args.calls, args.revalidate_s) for s in scenarios]
    print(f"{'scenario':8} {'warm µs (med/p99/cpu)':>24} {'cold µs (med/cpu)':>18} {'amortised':>10} {'nvml µs (cpu)':>14} {'% core @1Hz':>12}")
    for r in results:
        w, c, n = r["warm_us"], r["cold_us"], r["nvml_lists_us"]
        print(f"{r['scenario']:8} {w['median']:>8} /{w['p99']:>7} /{w['cpu']:>7} {c['median']:>9} /{c['cpu']:>7} "
              f"{r['amortised_cpu_us']:>10} {n['cpu']:>14} {r['pct_core_at_1hz']:>11}%")
    print(f"pod list ({results[0]['pods_on_node']} pods, local server, one-off per new pod): {results[0]['pod_list_ms']} ms")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
