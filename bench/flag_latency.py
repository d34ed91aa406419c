"""Wall time from acknowledging the sample that triggers a flag to the flag being served.

A collector process (`laggard server`, SQLite) and a simulated fleet shaped like `laggard demo`
(16 nodes × 8 H100 through the real pynvml bindings on the simulated NVML library), pushing
one sample per node per second. Every few seconds a fault is injected into another GPU; for
each resulting episode the latency is: when GET /api/v1/stragglers first listed it, minus when
the POST carrying its `detected_at` sample was acknowledged.

    python bench/flag_latency.py [--faults 10] [--interval 1]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.runner import collect  # noqa: E402
from agent.sample import build_batch  # noqa: E402
from agent.sim.fleet import SimFleet  # noqa: E402
from bench.ingest import _free_port, _wait_ready  # noqa: E402

FAULTS = ["thermal", "clocks_stuck_low", "power_brake", "hw_slowdown", "nvlink_down=4"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=16)
    p.add_argument("--faults", type=int, default=10)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--spacing", type=int, default=8, help="samples between injected faults")
    args = p.parse_args()

    port = _free_port()
    tmp = tempfile.mkdtemp()
    env = os.environ | {"LAGGARD_DATABASE_URL": f"sqlite:///{tmp}/flag.db", "LAGGARD_PORT": str(port), "LAGGARD_INSECURE": "true"}
    server = subprocess.Popen([sys.executable, "-m", "server.cli", "--log-level", "warning", "server"], env=env)
    fleet = SimFleet()
    try:
        _wait_ready(port)
        url = f"http://127.0.0.1:{port}"
        nodes = [fleet.add_node(f"gpu-node-{i:03d}", seed=i) for i in range(args.nodes)]
        acked: dict[tuple[str, float], float] = {}
        seen: dict[int, float] = {}
        stop = threading.Event()
        watcher = threading.Thread(target=_watch, args=(url, seen, stop), daemon=True)
        watcher.start()
        client = httpx.Client(timeout=30, headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
        t0 = float(int(time.time()))
        steps = 10 + args.faults * args.spacing
        for k in range(steps):
            ts = t0 + k * args.interval
            if k >= 10 and (k - 10) % args.spacing == 0:
                n = (k - 10) // args.spacing
                nodes[n % len(nodes)].inject(f"gpu{n % 8}:{FAULTS[n % len(FAULTS)]}")
            for node in nodes:
                sample = collect(ts, node, node.read_nics)
                body = build_batch([sample], node=node.name, cluster="bench", labels={"job": "j"}, agent_info={})
                r = client.post(f"{url}/api/v1/samples", content=gzip.compress(json.dumps(body).encode()))
                r.raise_for_status()
                acked[(node.name, ts)] = time.monotonic()
            time.sleep(max(0.0, ts + args.interval - time.time()))
        time.sleep(2)
        stop.set()
        watcher.join()
        episodes = httpx.get(f"{url}/api/v1/stragglers/history", params={"since": t0, "until": t0 + steps * args.interval}).json()["stragglers"]
    finally:
        fleet.close()
        server.terminate()
        server.wait(30)
    latencies = sorted(seen[e["id"]] - acked[(e["node"], e["detected_at"])] for e in episodes if e["id"] in seen)
    print(f"{len(episodes)} episodes for {args.faults} injected faults; {len(latencies)} latencies measured")
    for e in episodes:
        print(f"  {e['node']} GPU {e['gpu']}: {e['cause']}: {e['summary'][:100]}")
    if latencies:
        print(f"flag latency after the acknowledgement: median {statistics.median(latencies) * 1000:.0f} ms, "
              f"max {latencies[-1] * 1000:.0f} ms (poll interval of this watcher: 20 ms)")
    return 0


def _watch(url: str, seen: dict[int, float], stop: threading.Event) -> None:
    with httpx.Client(timeout=10) as client:
        while not stop.is_set():
            for s in client.get(f"{url}/api/v1/stragglers").json()["stragglers"]:
                seen.setdefault(s["id"], time.monotonic())
            time.sleep(0.02)


if __name__ == "__main__":
    sys.exit(main())
