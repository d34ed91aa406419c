"""`laggard demo`: the collector on SQLite and a simulated fleet pushing to it over real HTTP.

Every node runs the real agent code path: NvmlGpuSource through the real pynvml bindings on
the simulated libnvidia-ml, the sysfs IB reader on a simulated tree, the sampling Runner and
the gzip/retry Pusher. Only the GPUs and NICs are simulated, and the processes on the GPUs:
two Slurm jobs over the nodes and the last node idle (JOBS, job_layout), each node's agent
attributing its GPUs through a simulated /proc (agent/sim/proctree.py), so the detector compares
the GPUs of each job with each other with no `job` label.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path

import httpx

from agent import __version__ as agent_version
from agent.push import Pusher
from agent.runner import Runner
from agent.sim.fleet import SimFleet, SimulatedNode
from server.app import create_app
from server.serve import RunningServer, start_in_thread
from server.settings import Settings

CLUSTER = "demo"
# A few nodes with something wrong, so there is something to find.
DEMO_FAULTS: dict[int, list[str]] = {
    2: ["gpu5:thermal"],
    5: ["gpu1:clocks_stuck_low"],
    7: ["gpu3:power_brake"],
    9: ["gpu0:nvlink_down=4"],
    11: ["ib2:degraded"],
    13: ["gpu6:xid=79"],
}


# (Slurm job id, job name): the first half of the busy nodes runs one, the rest the other.
JOBS = (("4101", "llm-pretrain"), ("4102", "llm-finetune"))


LOCK_FILES = (".detector-lock", ".write-lock")


def run_demo(args: argparse.Namespace) -> int:
    database_url = args.database_url or _fresh_sqlite(Path.cwd() / "laggard-demo.db")
    # The demo runs on loopback with simulated agents: no tokens (the app warns loudly).
    settings = Settings(database_url=database_url, host=args.host, port=args.port, auth={"insecure": True})
    try:
        server = start_in_thread(create_app(settings), host=args.host, port=args.port)
    except OSError as exc:
        print(f"laggard demo: cannot listen on {args.host}:{args.port}: {exc.strerror}; try --port", file=sys.stderr)
        return 1
    fleet = SimFleet()
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    agents: list[tuple[Pusher, threading.Thread]] = []
    try:
        layout = job_layout(args.nodes)
        nodes = [_add_node(fleet, i, args, layout[i]) for i in range(args.nodes)]
        for i, node in enumerate(nodes):
            agents.append(_start_agent(node, rack=f"r{i // 4:02d}", url=server.url, interval=args.interval, stop=stop))
        _print_banner(server, nodes, args, layout)
        _show_progress(server, agents, args, stop)
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        for pusher, thread in agents:
            thread.join(args.interval + 5)
            pusher.close(flush_timeout=5)
        fleet.close()
        server.stop()
        if args.database_url is None:
            _remove_lock_files(database_url)
    print("\nstopped.")
    return 0


def _fresh_sqlite(path: Path) -> str:
    # The demo starts from an empty database each time; its file name is its own.
    for suffix in ("", "-wal", "-shm", *LOCK_FILES):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return f"sqlite:///{path}"


def _remove_lock_files(database_url: str) -> None:
    # Side files of the locks the demo's collector held (server/detect/leader.py,
    # server/store/write_lock.py); its database stays, for a look afterwards.
    path = database_url.removeprefix("sqlite:///")
    for suffix in LOCK_FILES:
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def job_layout(nodes: int) -> list[tuple[str, str, int] | None]:
    """Per node: (job id, job name, the node's rank within the job), or None for the idle node
    (the last one, once there are three nodes or more)."""
    busy = nodes - 1 if nodes >= 3 else nodes
    first = (busy + 1) // 2
    layout: list[tuple[str, str, int] | None] = []
    for i in range(busy):
        job_id, name = JOBS[0] if i < first else JOBS[1]
        layout.append((job_id, name, i if i < first else i - first))
    return layout + [None] * (nodes - busy)


def _add_node(fleet: SimFleet, i: int, args: argparse.Namespace, job: tuple[str, str, int] | None) -> SimulatedNode:
    faults = [f for f in DEMO_FAULTS.get(i, []) if _fits(f, args.gpus)]
    node = fleet.add_node(f"gpu-node-{i:03d}", model=args.model.lower(), gpus=args.gpus, faults=faults, seed=i,
                          workload="idle" if job is None else "busy", attribution=True)
    if job is not None:
        job_id, name, rank = job
        node.sim.run_slurm_job(job_id, name, user="demo", first_task=rank * args.gpus)
    return node


def _fits(fault: str, gpus: int) -> bool:
    target = fault.split(":", 1)[0]
    return not target.startswith("gpu") or int(target[3:]) < gpus


def _start_agent(node: SimulatedNode, *, rack: str, url: str, interval: float, stop: threading.Event) -> tuple[Pusher, threading.Thread]:
    info = {"version": agent_version, "driver": node.driver_version(), "cuda": node.cuda_version()}
    pusher = Pusher(url, node=node.name, cluster=CLUSTER, labels={"rack": rack}, agent_info=info,
                    batch_size=1, max_delay=interval).start()
    runner = Runner(node, pusher, interval=interval, read_nics=node.read_nics, stop=stop)
    return pusher, runner.start()


def _print_banner(server: RunningServer, nodes: list[SimulatedNode], args: argparse.Namespace,
                  layout: list[tuple[str, str, int] | None]) -> None:
    jobs = "; ".join(f"{name} (Slurm job {job_id}) on {_span([n.name for n, j in zip(nodes, layout) if j and j[0] == job_id])}"
                     for job_id, name in JOBS if any(j and j[0] == job_id for j in layout))
    idle = [n.name for n, j in zip(nodes, layout) if j is None]
    faulty = ", ".join(f"{nodes[i].name} ({'; '.join(DEMO_FAULTS[i])})" for i in sorted(DEMO_FAULTS) if i < len(nodes))
    url = server.url
    print(f"""
Laggard demo: status page at {url}/ui
Collector at {url} (SQLite), {len(nodes)} simulated nodes × {args.gpus} {args.model}, one sample every {args.interval:g} s
  API docs      {url}/docs
  nodes         {url}/api/v1/nodes
  one node      {url}/api/v1/nodes/{nodes[0].name}
  a GPU series  {url}/api/v1/gpus/<uuid>/series?metric=sm_clock_mhz
  jobs: {jobs}{'; idle: ' + ', '.join(idle) if idle else ''}
  injected faults: {faulty or 'none'}
Ctrl-C to stop.
""", flush=True)


def _span(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]}"


def _show_progress(server: RunningServer, agents: list[tuple[Pusher, threading.Thread]], args: argparse.Namespace, stop: threading.Event) -> None:
    writer = server.server.config.app.state.services.writer
    started = time.monotonic()
    last = (started, 0)
    shown: dict[int, dict] = {}
    while not stop.wait(max(args.interval, 2.0)):
        _show_stragglers(server.url, shown)
        now = time.monotonic()
        committed = writer.committed_samples
        rate = (committed - last[1]) / max(now - last[0], 1e-9)
        last = (now, committed)
        sent = sum(p.stats.sent_samples for p, _ in agents)
        failing = sum(p.stats.failed_attempts for p, _ in agents)
        reporting = sum(1 for p, _ in agents if p.stats.sent_samples)
        print(f"  {now - started:6.0f}s  nodes reporting {reporting}/{len(agents)}  samples committed {committed} "
              f"({rate:.1f}/s, {committed * args.gpus} GPU-samples)  acknowledged to agents {sent}  failed pushes {failing}  "
              f"stragglers {len(shown)}", flush=True)
        if args.duration is not None and now - started >= args.duration:
            return


def _show_stragglers(url: str, shown: dict[int, dict]) -> None:
    """Print episodes as they open and resolve, read through the public API."""
    try:
        active = {s["id"]: s for s in httpx.get(f"{url}/api/v1/stragglers", timeout=5).json()["stragglers"]}
    except httpx.HTTPError:
        return
    for eid, s in active.items():
        if eid not in shown:
            where = s["node"] if s["gpu"] is None else f"{s['node']} GPU {s['gpu']}"
            print(f"  ▲ straggler #{eid} {where}: {s['cause']} ({s['severity']}) — {s['summary']}  {url}/ui/episodes/{eid}", flush=True)
    for eid in [e for e in shown if e not in active]:
        s = shown[eid]
        print(f"  ▼ resolved #{eid} {s['node']}: {s['cause']}", flush=True)
    shown.clear()
    shown.update(active)
