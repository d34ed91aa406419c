"""Soak: twice the demo fleet (32 nodes x 8 GPUs, demo faults, real agent code on simulated
GPUs) pushing to a real `laggard server` over loopback HTTP with authentication on, for ten
minutes. A probe node times every one of its own pushes exactly. Every 10 s it records the collector's memory (RSS of its whole process tree) and
scrapes its /metrics; at the end it checks every acknowledged sample is stored, and states the
bounds it held to (docs/reliability.md).

    python bench/soak.py --duration 600 --json bench/out/soak.json
    python bench/soak.py --duration 30 --interval 1          # a quick look

Exit status 1 if a bound is broken: peak RSS over --max-rss-mb, ingest p99 (over the whole
run over --max-p99-ms, or in any minute over --max-minute-p99-ms, as the probe measured it; the
collector's own histogram is reported too, at bucket resolution), any 5xx, any rejected or dropped sample, or an
acknowledged sample missing from the database.
"""

from __future__ import annotations

import argparse
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent import __version__ as agent_version  # noqa: E402
from agent.push import Pusher  # noqa: E402
from agent.runner import Runner  # noqa: E402
from agent.sim.fleet import SimFleet  # noqa: E402
from bench.ingest import _children, _free_port, _wait_ready  # noqa: E402
from server.demo import DEMO_FAULTS  # noqa: E402

DURATION = "laggard_ingest_request_duration_seconds"
CLUSTER = "soak"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=600.0)
    p.add_argument("--nodes", type=int, default=32, help="twice the demo's 16")
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--interval", type=float, default=1.0, help="agent sampling interval (the demo: 5 s; 1 s is five times the load)")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--database-url", default=None, help="default: a fresh SQLite file")
    p.add_argument("--max-rss-mb", type=float, default=400.0)
    p.add_argument("--max-p99-ms", type=float, default=250.0, help="bound on the probe's p99 over the whole run")
    p.add_argument("--max-minute-p99-ms", type=float, default=500.0, help="bound on the probe's p99 in every minute")
    p.add_argument("--json", default=None, help="write the figures here")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = args.database_url or f"sqlite:///{tmp}/soak.db"
        agent_token, read_token = _tokens(url)
        result = run(args, url, agent_token, read_token, Path(tmp))
    print(json.dumps(result["summary"], indent=2))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0 if result["summary"]["bounds_held"] else 1


def _tokens(url: str) -> tuple[str, str]:
    from server.auth.store import create_token
    from server.store import migrate
    from server.store.engine import make_engine

    engine = make_engine(url)
    try:
        migrate.upgrade(engine)
        with engine.begin() as conn:
            return (create_token(conn, scopes=frozenset({"agent"}), cluster=CLUSTER, name="soak agents")[0],
                    create_token(conn, scopes=frozenset({"read"}), name="soak monitor")[0])
    finally:
        engine.dispose()


def run(args: argparse.Namespace, url: str, agent_token: str, read_token: str, tmp: Path) -> dict:
    port = _free_port()
    env = os.environ | {"LAGGARD_DATABASE_URL": url, "LAGGARD_PORT": str(port), "LAGGARD_WORKERS": str(args.workers),
                        "LAGGARD_INSECURE": "false"}
    log_path = tmp / "collector.log"
    with open(log_path, "w") as log:
        server = subprocess.Popen([sys.executable, "-m", "server.cli", "--log-level", "warning", "server"], env=env,
                                  stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    fleet, stop = SimFleet(), threading.Event()
    agents: list[tuple[Pusher, threading.Thread]] = []
    timeline: list[dict] = []
    latencies: list[tuple[float, float, int]] = []  # (monotonic sent, seconds, status) of the probe's pushes
    try:
        _wait_ready(port)
        for i in range(args.nodes):
            node = fleet.add_node(f"soak-{i:03d}", model="h100", gpus=args.gpus, faults=DEMO_FAULTS.get(i % 16, []), seed=i)
            info = {"version": agent_version, "driver": node.driver_version(), "cuda": node.cuda_version()}
            pusher = Pusher(base, node=node.name, cluster=CLUSTER, labels={"job": "soak", "rack": f"r{i // 4:02d}"}, agent_info=info,
                            token=agent_token, batch_size=1, max_delay=args.interval).start()
            agents.append((pusher, Runner(node, pusher, interval=args.interval, read_nics=node.read_nics, stop=stop).start()))
        probe_node = fleet.add_node("soak-probe", model="h100", gpus=args.gpus, faults=[], seed=10_000)
        probe = threading.Thread(target=_probe, args=(base, agent_token, probe_node, stop, latencies), daemon=True)
        probe.start()
        started = time.monotonic()
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {read_token}"}, timeout=30) as monitor:
            while (elapsed := time.monotonic() - started) < args.duration:
                time.sleep(min(10.0, args.duration - elapsed))
                timeline.append(now := _observe(monitor, server.pid, time.monotonic() - started, agents))
                print(f"  {now['t_s']:5.0f}s  rss {now['rss_mb']:6.1f} MB (anon {now['rss_anon_mb']:.1f})  acked {now['acked_samples']}  "
                      f"failed pushes {now['failed_attempts']}", flush=True)
    finally:
        stop.set()
        for pusher, thread in agents:
            thread.join(args.interval + 5)
            pusher.close(flush_timeout=10)
        fleet.close()
        final_metrics = _scrape(base, read_token)
        server.terminate()
        exit_code = server.wait(60)
    stored = _stored_gpu_samples(url)
    log_text = log_path.read_text()
    summary = _summary(args, timeline, final_metrics, agents, stored, exit_code, log_text)
    _add_probe_figures(summary, latencies, args)
    return {"args": vars(args), "timeline": timeline, "summary": summary}


def _probe(base: str, token: str, node, stop: threading.Event, latencies: list) -> None:
    """One more node pushing a sample every 0.25 s and timing each answer exactly, as an agent
    would see it (the histogram in /metrics only has bucket resolution)."""
    import gzip

    from agent.sample import Sample, build_batch, json_default

    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json", "Content-Encoding": "gzip"}
    with httpx.Client(base_url=base, headers=headers, timeout=30) as client:
        while not stop.wait(0.25):
            ts = time.time()
            sample = Sample(ts=ts, gpus=node.read(ts), nics=node.read_nics(ts))
            body = build_batch([sample], node=node.name, cluster=CLUSTER, labels={"job": "soak"}, agent_info={"version": agent_version})
            content = gzip.compress(json.dumps(body, default=json_default).encode())
            sent = time.monotonic()
            try:
                status = client.post("/api/v1/samples", content=content).status_code
            except httpx.HTTPError:
                status = 0
            latencies.append((sent, time.monotonic() - sent, status))


def _add_probe_figures(summary: dict, latencies: list[tuple[float, float, int]], args) -> None:
    if not latencies:
        summary["bounds_held"] = False
        return
    t0 = latencies[0][0]
    ms = sorted(d * 1000 for _, d, _ in latencies)
    minutes: dict[int, list[float]] = {}
    for sent, d, _ in latencies:
        minutes.setdefault(int((sent - t0) // 60), []).append(d * 1000)
    worst = max(_pct(sorted(v), 0.99) for v in minutes.values())
    summary.update({
        "probe_requests": len(ms), "probe_non_200": sum(1 for *_, st in latencies if st != 200),
        "probe_p50_ms": round(_pct(ms, 0.5), 1), "probe_p99_ms": round(_pct(ms, 0.99), 1), "probe_max_ms": round(ms[-1], 1),
        "probe_p99_ms_worst_minute": round(worst, 1),
    })
    summary["bounds_held"] = bool(summary["bounds_held"] and summary["probe_non_200"] == 0 and summary["probe_p99_ms"] <= args.max_p99_ms
                                  and worst <= args.max_minute_p99_ms)


def _pct(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def _observe(monitor: httpx.Client, pid: int, t: float, agents) -> dict:
    text = monitor.get("/metrics").text
    return {"t_s": round(t, 1), "rss_mb": round(_tree_rss_mb(pid), 1), "rss_anon_mb": round(_tree_rss_mb(pid, "RssAnon"), 1),
            "rss_file_mb": round(_tree_rss_mb(pid, "RssFile"), 1), "histogram": _histogram(text), "rejects": _rejects(text),
            "acked_samples": sum(p.stats.sent_samples for p, _ in agents),
            "failed_attempts": sum(p.stats.failed_attempts for p, _ in agents)}


def _scrape(base: str, token: str) -> str:
    try:
        return httpx.get(f"{base}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=30).text
    except httpx.HTTPError:
        return ""


def _tree_rss_mb(pid: int, field: str = "VmRSS") -> float:
    """RSS of the process and its children. RssAnon is the heap; RssFile includes the pages of
    the SQLite file that the collector maps (mmap_size), which grow with the database."""
    total = 0
    for p in [pid, *_children(pid)]:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith(f"{field}:"):
                    total += int(line.split()[1])
        except FileNotFoundError:
            pass
    return total / 1024


def _histogram(text: str) -> dict[float, float]:
    """{le: cumulative count} of the ingest latency histogram."""
    out = {}
    for line in text.splitlines():
        if line.startswith(f"{DURATION}_bucket{{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out[float(le)] = float(line.rsplit(" ", 1)[1])
    return out


def _rejects(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith("laggard_ingest_rejected_requests_total{"):
            code = line.split('code="', 1)[1].split('"', 1)[0]
            out[code] = out.get(code, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def _quantile(hist_now: dict[float, float], hist_before: dict[float, float], q: float) -> float | None:
    """The q-quantile's bucket bound (seconds) of the requests between two scrapes."""
    les = sorted(hist_now)
    counts = [hist_now[le] - hist_before.get(le, 0.0) for le in les]
    total = counts[-1] if counts else 0
    if total <= 0:
        return None
    for le, c in zip(les, counts, strict=True):
        if c >= q * total:
            return le
    return les[-1]


def _stored_gpu_samples(url: str) -> int:
    from sqlalchemy import func, select

    from server.store import schema
    from server.store.engine import make_engine

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(select(func.count()).select_from(schema.GpuSample)).scalar()
    finally:
        engine.dispose()


def _summary(args, timeline, final_metrics: str, agents, stored: int, exit_code: int, log_text: str) -> dict:
    final_hist = _histogram(final_metrics) or (timeline[-1]["histogram"] if timeline else {})
    per_minute = []
    marks = [t for t in timeline if t["t_s"] % 60 < 10 or t is timeline[-1]]
    before: dict[float, float] = {}
    for mark in marks:
        if (p99 := _quantile(mark["histogram"], before, 0.99)) is not None:
            per_minute.append(p99 * 1000)
        before = mark["histogram"]
    rss = [t["rss_mb"] for t in timeline]
    p99_all = _quantile(final_hist, {}, 0.99)
    rejects = _rejects(final_metrics)
    acked = sum(p.stats.sent_samples for p, _ in agents)
    dropped = sum(p.dropped for p, _ in agents)
    rejected = sum(p.stats.rejected_samples for p, _ in agents)
    errors_in_log = sum(1 for line in log_text.splitlines() if "ERROR" in line or "Traceback" in line)
    five_xx = sum(v for code, v in rejects.items() if code.startswith("5"))
    summary = {
        "duration_s": args.duration, "nodes": args.nodes, "gpus_per_node": args.gpus, "interval_s": args.interval,
        "requests": final_hist.get(float("inf"), max(final_hist.values(), default=0)),
        "acked_samples": acked, "acked_gpu_samples": acked * args.gpus, "stored_gpu_samples": stored,
        "rss_mb_first": rss[0] if rss else None, "rss_mb_max": max(rss, default=None), "rss_mb_median": statistics.median(rss) if rss else None,
        "rss_anon_mb_by_minute": [max(t["rss_anon_mb"] for t in timeline[i:i + 6]) for i in range(0, len(timeline), 6)],
        "rss_file_mb_by_minute": [max(t["rss_file_mb"] for t in timeline[i:i + 6]) for i in range(0, len(timeline), 6)],
        "p50_ms_bucket": _ms(_quantile(final_hist, {}, 0.5)), "p99_ms_bucket": _ms(p99_all), "p99_ms_worst_minute": max(per_minute, default=None),
        "rejected_requests_by_code": rejects, "agent_failed_attempts": sum(p.stats.failed_attempts for p, _ in agents),
        "agent_dropped_samples": dropped, "agent_rejected_samples": rejected, "collector_errors_in_log": errors_in_log,
        "collector_exit_code": exit_code, "max_rss_mb_bound": args.max_rss_mb, "max_p99_ms_bound": args.max_p99_ms,
        "max_minute_p99_ms_bound": args.max_minute_p99_ms, "probe_gpu_samples_stored_too": "stored counts the probe node's samples as well",
    }
    summary["bounds_held"] = bool(
        rss and max(rss) <= args.max_rss_mb and five_xx == 0 and dropped == 0 and rejected == 0
        and stored >= acked * args.gpus and errors_in_log == 0 and exit_code == 0
    )
    return summary


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


if __name__ == "__main__":
    sys.exit(main())
