"""Scheduler-hint benchmark (docs/operations.md "Scaling and sizing"): GET /api/v1/hints and the
kube-scheduler extender at 100,000 GPUs.

Builds the fleet database of bench/metrics.py (12,500 nodes × 8 GPUs for 100,000 GPUs, open
episodes on 1% of the GPUs), starts `laggard server` in its own process, and times, over real
HTTP, one request after another (as kube-scheduler sends them, one pod at a time):

  GET  /api/v1/hints                      the whole document
  GET  /api/v1/hints?problems_only=true   the nodes that are not ok
  POST /scheduler/filter                  ExtenderArgs with 1,000 NodeNames
  POST /scheduler/prioritize              the same body

`--requests` of each (interleaved, so every kind meets the cache's refreshes), p50/p99 and the
server's peak RSS. The run lasts several hints.cache_ttl_s, so the figures include requests that
find the cache expired.

    python bench/hints.py                                   # SQLite in a temp dir, 100,000 GPUs
    python bench/hints.py --database-url postgresql://postgres@127.0.0.1:5432/postgres
    python bench/hints.py --gpus 10000 --requests 200       # quicker
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402
import orjson  # noqa: E402

from bench.metrics import GPUS_PER_NODE, _peak_rss_bytes, collector_process, populate  # noqa: E402

CANDIDATES = 1000


def filter_body(nodes: int, *, seed: int = 0) -> bytes:
    """ExtenderArgs as kube-scheduler sends them with nodeCacheCapable: true: a pod and the names
    of 1,000 candidate nodes (a random sample of the fleet's)."""
    rng = random.Random(seed)
    names = [f"gpu-node-{n:05d}" for n in rng.sample(range(nodes), min(CANDIDATES, nodes))]
    pod = {"metadata": {"name": "trainer-0", "namespace": "ml"}, "spec": {"containers": [{"name": "main"}]}}
    return orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})


def percentile(times: list[float], q: float) -> float:
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _requests(body: bytes) -> dict[str, tuple[str, str, bytes | None]]:
    return {
        "hints": ("GET", "/api/v1/hints", None),
        "hints_problems_only": ("GET", "/api/v1/hints?problems_only=true", None),
        "filter": ("POST", "/scheduler/filter", body),
        "prioritize": ("POST", "/scheduler/prioritize", body),
    }


def time_requests(base: str, body: bytes, count: int) -> dict[str, dict[str, float]]:
    """Each request kind `count` times, interleaved; the first round (which computes the hints the
    first time, as after a restart) is left out."""
    kinds = _requests(body)
    times: dict[str, list[float]] = {k: [] for k in kinds}
    sizes: dict[str, int] = {}
    with httpx.Client(base_url=base, timeout=60, headers={"content-type": "application/json"}) as client:
        for method, path, content in kinds.values():
            client.request(method, path, content=content).raise_for_status()
        for _ in range(count):
            for kind, (method, path, content) in kinds.items():
                t = time.perf_counter()
                response = client.request(method, path, content=content)
                times[kind].append(time.perf_counter() - t)
                response.raise_for_status()
                sizes[kind] = len(response.content)
    return {k: {"p50_ms": statistics.median(v) * 1e3, "p99_ms": percentile(v, 0.99) * 1e3, "max_ms": max(v) * 1e3,
                "bytes": sizes[k], "requests": len(v)} for k, v in times.items()}


def run(url: str, *, gpus: int, requests: int) -> dict:
    t = time.perf_counter()
    shape = populate(url, gpus=gpus, samples=1, now=time.time())
    print(f"populated {shape} in {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
    body = filter_body(shape["nodes"])
    with collector_process(url, env={"LAGGARD_INSECURE": "1"}) as (base, proc):
        t = time.perf_counter()
        httpx.get(f"{base}/api/v1/hints", timeout=120).raise_for_status()
        cold = time.perf_counter() - t
        result = time_requests(base, body, requests)
        rss = _peak_rss_bytes(proc.pid)
    return {**shape, "first_hints_s": cold, "requests": result, "server_peak_rss_bytes": rss}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, default=100_000, help=f"GPUs ({GPUS_PER_NODE} per node)")
    p.add_argument("--requests", type=int, default=200, help="requests of each kind")
    p.add_argument("--database-url", default=None, help="PostgreSQL admin URL (a fresh database is made); default SQLite in a temp dir")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        from bench.ingest import fresh_database

        url = fresh_database(args.database_url, tmp, "hints")
        result = run(url, gpus=args.gpus, requests=args.requests)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{result['gpus']:,} GPUs on {result['nodes']:,} nodes, {result['open_episodes']:,} open episodes; first hints "
          f"{result['first_hints_s']:.2f} s; server peak RSS {result['server_peak_rss_bytes'] / 2**20:.0f} MiB")
    for kind, r in result["requests"].items():
        print(f"  {kind:<20} p50 {r['p50_ms']:7.1f} ms  p99 {r['p99_ms']:7.1f} ms  max {r['max_ms']:7.1f} ms  "
              f"({r['requests']} requests, {r['bytes'] / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
