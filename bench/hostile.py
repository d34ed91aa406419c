"""Hostile load beside a well-behaved fleet (issue #12; docs/reliability.md, "Hostile agents").

A real `laggard server` (SQLite, authentication on, loopback) and a fleet of well-behaved agents
(--nodes, each pushing one sample of 8 GPUs and 8 ports every --interval s, open loop, each
answer timed). Three phases of --duration s each: the fleet alone; the fleet beside the hostile
load; the fleet alone again, after it. The hostile load, each part with a token of its own:

- heavy: --heavy-threads threads pushing the largest batches the limits allow (1,000 samples x
  64 GPUs, gzip) as fast as they are answered, ignoring Retry-After (a 429 costs them 50 ms);
- garbage: bodies that are not JSON, not a batch, nested 100,000 deep, or corrupt gzip;
- new names: a push under a new node name every time;
- slow bodies: connections that promise a body and send it a few bytes a second.

Then --idle s with no load at all. Every 2 s the collector's RSS (its process tree). Reports the
fleet's acknowledged pushes/s and p50/p99 in each phase, the hostile answers by status, and the
RSS over time; exit status 1 if the fleet's p99 beside the hostile load is over twice its p99
alone or the RSS went over --max-rss-mb.

    python bench/hostile.py --duration 120 --json bench/out/hostile.json
    python bench/hostile.py --duration 20 --idle 10        # a quick look
"""

from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bodies import gpu_record, nic_record  # noqa: E402
from bench.ingest import _free_port, _wait_ready  # noqa: E402
from bench.soak import _pct, _tree_rss_mb  # noqa: E402

CLUSTER = "hostile"
PUSH = "/api/v1/samples"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=120.0, help="seconds of each phase (alone, beside the hostile load, alone again)")
    p.add_argument("--idle", type=float, default=60.0, help="seconds without any load at the end, RSS still recorded")
    p.add_argument("--warmup", type=float, default=10.0, help="seconds of the fleet alone before the first phase, not counted")
    p.add_argument("--nodes", type=int, default=32, help="well-behaved agents")
    p.add_argument("--interval", type=float, default=0.5, help="seconds between an agent's pushes")
    p.add_argument("--heavy-threads", type=int, default=4)
    p.add_argument("--heavy-samples", type=int, default=1000, help="samples of 64 GPUs in each heavy batch (1,000: the most allowed)")
    p.add_argument("--parts", default="heavy,garbage,names,slow", help="which parts of the hostile load to run")
    p.add_argument("--max-rss-mb", type=float, default=400.0)
    p.add_argument("--same-process", action="store_true",
                   help="run the hostile load on threads of this process, beside the fleet's (as before 2026-12-05): "
                        "the fleet's timings then include waiting for this process's own GIL")
    p.add_argument("--offenders-nice", type=int, default=0,
                   help="the offenders' process runs at this nice level (19: its own CPU yields to the collector's and the "
                        "fleet's, as offenders on other machines would not compete for this one's cores)")
    p.add_argument("--collector-env", action="append", default=[], metavar="NAME=VALUE", help="extra environment of the collector")
    p.add_argument("--json", default=None, help="write the figures here")
    p.add_argument("--keep-log", default=None, metavar="PATH", help="copy the collector's log here")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = run(args, f"sqlite:///{tmp}/hostile.db", Path(tmp))
        if args.keep_log:
            shutil.copyfile(Path(tmp) / "collector.log", args.keep_log)
    print(json.dumps(result["summary"], indent=2))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0 if result["summary"]["bounds_held"] else 1


def _tokens(url: str, names: list[str]) -> dict[str, str]:
    from server.auth.store import create_token
    from server.store import migrate
    from server.store.engine import make_engine

    engine = make_engine(url)
    try:
        migrate.upgrade(engine)
        with engine.begin() as conn:
            return {n: create_token(conn, scopes=frozenset({"agent"}), cluster=CLUSTER, name=n)[0] for n in names}
    finally:
        engine.dispose()


def run(args: argparse.Namespace, url: str, tmp: Path) -> dict:
    tokens = _tokens(url, ["fleet", "heavy", "garbage", "names", "slow"])
    port = _free_port()
    env = os.environ | {"LAGGARD_DATABASE_URL": url, "LAGGARD_PORT": str(port), "LAGGARD_INSECURE": "false"}
    env |= dict(kv.split("=", 1) for kv in args.collector_env)
    with open(tmp / "collector.log", "w") as log:
        server = subprocess.Popen([sys.executable, "-m", "server.cli", "--log-level", "warning", "server"], env=env,
                                  stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    rss: list[tuple[float, float, float]] = []  # (t, RSS, of which anonymous), MB
    done = threading.Event()
    try:
        _wait_ready(port)
        started = time.monotonic()
        threading.Thread(target=_watch_rss, args=(server.pid, started, rss, done), daemon=True).start()
        _phase(args, base, tokens, port, hostile=False, t0=0.0, seconds=args.warmup)  # nodes registered, caches warm
        phases = {}
        for name, hostile in (("alone", False), ("beside_hostile", True), ("alone_after", False)):
            phases[name] = _phase(args, base, tokens, port, hostile=hostile, t0=time.monotonic() - started)
            print(f"  {name}: {json.dumps(phases[name]['fleet'])}", flush=True)
        time.sleep(args.idle)
        done.set()
    finally:
        server.terminate()
        exit_code = server.wait(60)
    return {"args": vars(args), "rss_mb": rss, "phases": phases,
            "summary": _summary(args, phases, rss, exit_code, (tmp / "collector.log").read_text())}


def _phase(args, base: str, tokens: dict[str, str], port: int, *, hostile: bool, t0: float, seconds: float | None = None) -> dict:
    stop = threading.Event()
    fleet: list[tuple[float, int]] = []  # (seconds, status) of every push of the fleet
    threads = [threading.Thread(target=_agent, args=(base, tokens["fleet"], i, args.interval, stop, fleet), daemon=True)
               for i in range(args.nodes)]
    parts = set(args.parts.split(",")) if hostile else set()
    seconds = args.duration if seconds is None else seconds
    answers: dict[str, Counter] = {}
    offender = None
    if parts and args.same_process:
        answers, hostile_threads = _hostile_threads(args, base, tokens, port, parts, stop)
        threads += hostile_threads
    elif parts:
        # The offenders are other machines: their work must not stall the fleet's own client
        # threads on this process's GIL, or the fleet's timings measure this script.
        spawn = multiprocessing.get_context("spawn")
        ready, results = spawn.Event(), spawn.Queue()
        offender = spawn.Process(target=_hostile_process, args=(args, base, tokens, port, sorted(parts), seconds, ready, results),
                                 daemon=True)
        offender.start()
        ready.wait(120)  # its bodies built, as the threads' are before a phase in one process
    _run_for(threads, seconds, stop)
    if offender is not None:
        answers = results.get(timeout=120)
        offender.join(60)
    ms = sorted(s * 1000 for s, _ in fleet)
    acked = sum(1 for _, st in fleet if st == 200)
    figures = {"t_start_s": round(t0, 1), "pushes": len(fleet), "acked": acked, "acked_per_s": round(acked / args.duration, 1),
               "non_200": dict(Counter(st for _, st in fleet if st != 200)),
               "p50_ms": round(_pct(ms, 0.5), 1) if ms else None, "p99_ms": round(_pct(ms, 0.99), 1) if ms else None,
               "max_ms": round(ms[-1], 1) if ms else None}
    return {"fleet": figures, "hostile": {k: dict(v) for k, v in answers.items() if v}}


def _hostile_threads(args, base: str, tokens: dict[str, str], port: int, parts: set[str],
                     stop: threading.Event) -> tuple[dict[str, Counter], list[threading.Thread]]:
    answers: dict[str, Counter] = {k: Counter() for k in ("heavy", "garbage", "names", "slow")}
    threads = []
    if "heavy" in parts:
        heavy_bodies = [_heavy_body(k, args.heavy_samples) for k in range(4)]
        threads += [threading.Thread(target=_heavy, args=(base, tokens["heavy"], heavy_bodies, stop, answers["heavy"]), daemon=True)
                    for _ in range(args.heavy_threads)]
    if "garbage" in parts:
        threads.append(threading.Thread(target=_garbage, args=(base, tokens["garbage"], stop, answers["garbage"]), daemon=True))
    if "names" in parts:
        threads.append(threading.Thread(target=_new_names, args=(base, tokens["names"], stop, answers["names"]), daemon=True))
    if "slow" in parts:
        threads += [threading.Thread(target=_slow_body, args=(port, tokens["slow"], stop, answers["slow"]), daemon=True) for _ in range(4)]
    return answers, threads


def _hostile_process(args, base: str, tokens: dict[str, str], port: int, parts: list[str], seconds: float, ready, results) -> None:
    """The hostile load for `seconds`, in a process of its own; its answers go to `results`."""
    os.nice(args.offenders_nice)
    stop = threading.Event()
    answers, threads = _hostile_threads(args, base, tokens, port, set(parts), stop)
    ready.set()
    _run_for(threads, seconds, stop)
    results.put(answers)


def _run_for(threads: list[threading.Thread], seconds: float, stop: threading.Event) -> None:
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join(60)


def _agent(base: str, token: str, i: int, interval: float, stop: threading.Event, out: list) -> None:
    """One well-behaved node: a sample of 8 GPUs and 8 ports every `interval` s, on schedule."""
    rng = random.Random(i)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json", "Content-Encoding": "gzip"}
    next_at = time.monotonic() + rng.uniform(0, interval)
    step = 0
    with httpx.Client(base_url=base, headers=headers, timeout=60) as client:
        while not stop.wait(max(0.0, next_at - time.monotonic())):
            step += 1
            body = {"version": 1, "node": f"good-{i:03d}", "cluster": CLUSTER, "labels": {"job": "bench"},
                    "samples": [{"ts": time.time(), "gpus": [gpu_record(rng, i, g, step) for g in range(8)],
                                 "nics": [nic_record(rng, d, step) for d in range(8)]}]}
            content = gzip.compress(json.dumps(body).encode(), compresslevel=1)
            sent = time.monotonic()
            try:
                status = client.post(PUSH, content=content).status_code
            except httpx.HTTPError:
                status = 0
            out.append((time.monotonic() - sent, status))
            next_at = max(next_at + interval, time.monotonic() - interval)  # open loop; a late push does not pile up


def _heavy_body(k: int, samples: int) -> bytes:
    """By default the largest batch the limits allow: 1,000 samples x 64 GPUs (identity and a
    few readings, to stay under the 16 MiB body limit), gzip."""
    t0 = time.time() - 7200 + k * 1000
    gpus = [{"index": g, "uuid": f"GPU-heavy-{g:02d}", "temp_c": 50.0 + g % 7, "power_w": 300.0 + g} for g in range(64)]
    body = {"version": 1, "node": "heavy-0", "cluster": CLUSTER, "samples": [{"ts": t0 + s, "gpus": gpus} for s in range(samples)]}
    return gzip.compress(json.dumps(body).encode(), compresslevel=1)


def _post_loop(base: str, token: str, stop: threading.Event, answers: Counter, body_of, pause_s: float) -> None:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    with httpx.Client(base_url=base, headers=headers, timeout=120) as client:
        n = 0
        while not stop.is_set():
            content, extra = body_of(n)
            n += 1
            try:
                r = client.post(PUSH, content=content, headers=extra)
                answers[str(r.status_code) + ("+retry-after" if "retry-after" in r.headers else "")] += 1
                status = r.status_code
            except httpx.HTTPError as exc:
                answers[type(exc).__name__] += 1
                status = 0
            stop.wait(pause_s if status != 429 else 0.05)


def _heavy(base: str, token: str, bodies: list[bytes], stop: threading.Event, answers: Counter) -> None:
    _post_loop(base, token, stop, answers, lambda n: (bodies[n % len(bodies)], {"Content-Encoding": "gzip"}), 0.0)


GARBAGE = [
    (b"\x00\xff not json", {}),
    (b'{"version": 1, "node": "x", "samples": "no"}', {}),
    (b'{"version": 1, "node": "x", "samples": [], "junk": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", {}),
    (b"\x1f\x8b\x08\x00 corrupt gzip", {"Content-Encoding": "gzip"}),
]


def _garbage(base: str, token: str, stop: threading.Event, answers: Counter) -> None:
    _post_loop(base, token, stop, answers, lambda n: GARBAGE[n % len(GARBAGE)], 0.05)


def _new_names(base: str, token: str, stop: threading.Event, answers: Counter) -> None:
    rng = random.Random(99)

    def body(n: int):
        doc = {"version": 1, "node": f"made-up-{n:07d}", "cluster": CLUSTER,
               "samples": [{"ts": time.time(), "gpus": [gpu_record(rng, 90_000 + n, g, n) | {"uuid": f"GPU-made-up-{n}-{g}"}
                                                        for g in range(8)]}]}
        return gzip.compress(json.dumps(doc).encode(), compresslevel=1), {"Content-Encoding": "gzip"}

    _post_loop(base, token, stop, answers, body, 0.02)


def _slow_body(port: int, token: str, stop: threading.Event, answers: Counter) -> None:
    """Promise 100 kB, send 10 bytes a second; start over when the collector gives up."""
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(f"POST {PUSH} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                          "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n".encode())
                while not stop.wait(1.0):
                    s.sendall(b'{"aaaaaaaa')
                answers["held_to_the_end"] += 1
        except OSError as exc:
            answers[type(exc).__name__] += 1
            stop.wait(1.0)


def _watch_rss(pid: int, started: float, out: list, done: threading.Event) -> None:
    while not done.wait(2.0):
        out.append((round(time.monotonic() - started, 1), round(_tree_rss_mb(pid), 1), round(_tree_rss_mb(pid, "RssAnon"), 1)))


def _summary(args, phases: dict, rss: list[tuple[float, float, float]], exit_code: int, log_text: str) -> dict:
    alone, hostile = phases["alone"]["fleet"], phases["beside_hostile"]["fleet"]
    ends = {name: ph["fleet"]["t_start_s"] + args.duration for name, ph in phases.items()}
    by_phase = {name: max((m for t, m, _ in rss if ph["fleet"]["t_start_s"] <= t < ends[name]), default=None) for name, ph in phases.items()}
    anon_by_phase = {name: max((a for t, _, a in rss if ph["fleet"]["t_start_s"] <= t < ends[name]), default=None)
                     for name, ph in phases.items()}
    idle = [m for t, m, _ in rss if t >= ends["alone_after"]]
    summary = {
        "duration_s_per_phase": args.duration, "idle_s": args.idle, "fleet_nodes": args.nodes, "fleet_interval_s": args.interval,
        "fleet_acked_per_s": {name: ph["fleet"]["acked_per_s"] for name, ph in phases.items()},
        "fleet_p99_ms": {name: ph["fleet"]["p99_ms"] for name, ph in phases.items()},
        "fleet_p50_ms": {name: ph["fleet"]["p50_ms"] for name, ph in phases.items()},
        "fleet_non_200": {name: ph["fleet"]["non_200"] for name, ph in phases.items()},
        "hostile_answers": phases["beside_hostile"]["hostile"],
        "rss_mb_first": rss[0][1] if rss else None, "rss_mb_max_by_phase": by_phase, "rss_anon_mb_max_by_phase": anon_by_phase,
        "rss_mb_idle_first_last": [idle[0], idle[-1]] if idle else None, "rss_mb_max": max((m for _, m, _ in rss), default=None),
        "collector_exit_code": exit_code,
        "collector_tracebacks_in_log": log_text.count("Traceback"),
    }
    p99_ok = alone["p99_ms"] is not None and hostile["p99_ms"] is not None and hostile["p99_ms"] <= 2 * alone["p99_ms"]
    summary["bounds_held"] = bool(p99_ok and summary["rss_mb_max"] is not None and summary["rss_mb_max"] <= args.max_rss_mb
                                  and not any(phases[n]["fleet"]["non_200"] for n in phases))
    return summary


if __name__ == "__main__":
    sys.exit(main())
