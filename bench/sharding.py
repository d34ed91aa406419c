"""Sharded detection benchmark (docs/operations.md): how fast detector replicas sharing the
clusters judge a backlog from the ingest log (reading the rows included), one replica against
several; and what taking over one cluster costs (its claim, read position, windows replayed
from storage, open episodes).

A fresh database is created on the server of --database-url (and dropped afterwards), a fleet
of --clusters clusters is stored through the collector's HTTP ingest with detection off, then
each replica count of --replicas judges it all from the start, each replica a process of its
own, timed from when they have all joined until every cluster is judged to its last instant.

    python bench/sharding.py --database-url postgresql://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing as mp
import random
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bodies import gpu_record, nic_record  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/test")
    p.add_argument("--clusters", type=int, default=2)
    p.add_argument("--nodes", type=int, default=16, help="nodes per cluster")
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--nics", type=int, default=1)
    p.add_argument("--instants", type=int, default=60)
    p.add_argument("--interval", type=float, default=5.0, help="sampling interval (s of sample time)")
    p.add_argument("--replicas", default="1,2", help="replica counts to run, comma-separated")
    args = p.parse_args()

    import psycopg

    name = f"laggard_shard_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.database_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = f"{args.database_url.rsplit('/', 1)[0]}/{name}"
    try:
        t0 = time.time() - args.instants * args.interval - 60
        gpu_samples = ingest(url, args, t0)
        last = t0 + (args.instants - 1) * args.interval
        print(f"{args.clusters} clusters x {args.nodes} nodes x {args.gpus} GPUs, {args.instants} instants: "
              f"{gpu_samples} GPU-samples stored")
        for replicas in [int(r) for r in args.replicas.split(",")]:
            wall, cpu = judge(url, replicas, args.clusters, last)
            print(f"{replicas} replica(s): judged in {wall:.2f} s wall, {gpu_samples / wall:,.0f} GPU-samples/s; "
                  f"CPU per replica {', '.join(f'{c:.2f}' for c in cpu)} s")
        print(f"an idle replica (every cluster judged to date, default poll 0.2 s): {idle(url) * 1000:.0f} ms CPU per second")
        claim = takeover(url)
        print(f"takeover of one cluster ({args.nodes * args.gpus} GPUs, windows replayed from storage): "
              f"median {claim:.3f} s")
    finally:
        with psycopg.connect(args.database_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return 0


def bodies(args, t0: float) -> list[bytes]:
    rng = random.Random(7)
    out = []
    for start in range(0, args.instants, 10):
        for c in range(args.clusters):
            for n in range(args.nodes):
                node = c * 1000 + n  # GPU UUIDs derive from it: unique across clusters
                samples = [{"ts": t0 + step * args.interval, "gpus": [gpu_record(rng, node, i, step) for i in range(args.gpus)],
                            "nics": [nic_record(rng, i, step) for i in range(args.nics)]}
                           for step in range(start, min(start + 10, args.instants))]
                body = {"version": 1, "node": f"node-{node:05d}", "cluster": f"cluster-{c}", "labels": {"job": "bench"},
                        "samples": samples}
                out.append(gzip.compress(json.dumps(body).encode()))
    return out


def ingest(url: str, args, t0: float) -> int:
    import httpx

    from server.app import create_app
    from server.serve import start_in_thread
    from server.settings import Settings

    server = start_in_thread(create_app(Settings(database_url=url, detection_enabled=False, insecure=True,
                                                 retention_interval_s=3600)))
    try:
        todo = bodies(args, t0)
        lock = threading.Lock()

        def push() -> None:
            with httpx.Client(timeout=60) as client:
                while True:
                    with lock:
                        if not todo:
                            return
                        body = todo.pop(0)
                    r = client.post(f"{server.url}/api/v1/samples", content=body,
                                    headers={"content-type": "application/json", "content-encoding": "gzip"})
                    assert r.status_code == 200, r.text

        threads = [threading.Thread(target=push) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        server.stop()
    return args.clusters * args.nodes * args.gpus * args.instants


def _replica(url: str, joined, go, done, cpu, poll_s: float = 0.01, warm_s: float = 0.0) -> None:
    import os

    from server.detect.service import DetectionService
    from server.detect.settings import DetectionSettings
    from server.store.engine import make_engine

    engine = make_engine(url)
    service = DetectionService(engine, DetectionSettings(), poll_s=poll_s, leader_retry_s=0.5 if warm_s == 0 else 2.0)
    service.leases.poll(set())  # a member before anyone starts: the shares are even from the first poll
    joined.release()
    go.wait()
    if warm_s:
        service.start()
        time.sleep(warm_s)
    before = os.times()
    if not warm_s:
        service.start()
    done.wait()
    service.stop()
    after = os.times()
    cpu.put((after.user + after.system) - (before.user + before.system))
    engine.dispose()


def judge(url: str, replicas: int, clusters: int, last: float) -> tuple[float, list[float]]:
    from sqlalchemy import text

    from server.store.engine import make_engine

    engine = make_engine(url)
    with engine.begin() as conn:  # judged from the start again
        for table in ("detector_progress", "episodes", "episode_events", "alert_outbox", "metric_counters"):
            conn.execute(text(f"DELETE FROM {table}"))
    ctx = mp.get_context("spawn")
    joined, go, done, cpu = ctx.Semaphore(0), ctx.Event(), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_replica, args=(url, joined, go, done, cpu)) for _ in range(replicas)]
    for proc in procs:
        proc.start()
    for _ in procs:
        joined.acquire()
    start = time.monotonic()
    go.set()
    while True:
        with engine.connect() as conn:
            judged = conn.execute(text("SELECT count(*) FROM detector_progress WHERE key LIKE 'judged_until:%' AND value >= :last"),
                                  {"last": last}).scalar()
        if judged == clusters:
            break
        time.sleep(0.02)
    wall = time.monotonic() - start
    done.set()
    used = [cpu.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join(60)
    engine.dispose()
    return wall, used


def idle(url: str, seconds: float = 10.0) -> float:
    """CPU seconds per second of a replica with nothing new to judge."""
    ctx = mp.get_context("spawn")
    joined, go, done, cpu = ctx.Semaphore(0), ctx.Event(), ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=_replica, args=(url, joined, go, done, cpu, 0.2, 3.0))
    proc.start()
    joined.acquire()
    go.set()
    time.sleep(3.0 + seconds)
    done.set()
    used = cpu.get(timeout=60)
    proc.join(60)
    return used / seconds


def takeover(url: str) -> float:
    from server.detect.settings import DetectionSettings
    from server.detect.shard import Shard
    from server.store.engine import make_engine

    engine = make_engine(url)
    times = []
    for _ in range(3):
        start = time.monotonic()
        Shard.claim(engine, "cluster-0", DetectionSettings())
        times.append(time.monotonic() - start)
    engine.dispose()
    return statistics.median(times)


if __name__ == "__main__":
    sys.exit(main())
