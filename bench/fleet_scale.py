"""A large fleet end to end (issue #17 item 3; docs/operations.md, "Scaling and sizing").

--nodes simulated nodes (8 GPUs and 8 IB ports each) in --clusters clusters push one sample
every --interval s, each node at its own phase of the interval, through real HTTP (keep-alive,
gzip, one agent token per cluster) to --replicas collectors (`laggard server`) on one
PostgreSQL, detection sharded across them by cluster. The generator is light: each node's body
is a template rendered with the sample time and its counters, not an agent process.

Every 5 s it records each replica's RSS (its process tree), PostgreSQL's CPU (every postgres
process) and WAL written (both for the whole server: run it on a server nothing else uses), the
database's size, and the detection lag: per cluster, the newest sample time ingested
minus the instant every node of the cluster has been judged to (detector_progress). At the end
it checks every acknowledged sample is stored.

    python bench/fleet_scale.py --database-url postgresql://postgres@127.0.0.1:5432/postgres \\
        --nodes 12500 --replicas 3 --minutes 10        # 100,000 GPUs: the target
    python bench/fleet_scale.py --database-url postgresql://postgres@127.0.0.1:5432/postgres \\
        --nodes 500 --minutes 3                        # what a 2-core machine carries

Exit status 1 if a push failed, an acknowledged sample is missing, or the generator fell more
than one interval behind its schedule (the fleet was not offered in full).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import queue
import random
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bodies import gpu_record, nic_record  # noqa: E402
from bench.ingest import CAPACITY_NOT_ADMISSION, _cpu_seconds_of, _free_port, _fresh_pg, _wait_ready  # noqa: E402
from bench.soak import _pct, _tree_rss_mb  # noqa: E402

GPUS = PORTS = 8
MONITOR_EVERY_S = 5.0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--database-url", required=True, help="a PostgreSQL server URL: a fresh database is made on it")
    p.add_argument("--nodes", type=int, default=12_500)
    p.add_argument("--clusters", type=int, default=4)
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--interval", type=float, default=5.0)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--clients", type=int, default=48, help="concurrent keep-alive connections, spread over the replicas")
    p.add_argument("--json", default=None, help="write the figures here")
    args = p.parse_args()
    url = _fresh_pg(args.database_url, "fleet_scale")
    tokens = _agent_tokens(url, args.clusters)
    fleet = Fleet(args.nodes, args.clusters, args.interval)
    replicas = [Replica(url, f"replica-{i}") for i in range(args.replicas)]
    try:
        for r in replicas:
            r.wait_ready()
        summary = run(args, url, fleet, tokens, replicas)
    finally:
        for r in replicas:
            r.stop()
    print(json.dumps(summary, indent=2))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(summary, indent=2))
    return 0 if summary["held"] else 1


class Fleet:
    """Each node's body as a template: the sample time and the counters are filled in per push."""

    def __init__(self, nodes: int, clusters: int, interval: float):
        rng = random.Random(11)
        self.interval = interval
        self.nodes = [(f"c{n % clusters}", f"node-{n:05d}") for n in range(nodes)]
        self.phase = [rng.uniform(0, interval) for _ in range(nodes)]
        self.templates = [self._template(rng, n, cluster, name) for n, (cluster, name) in enumerate(self.nodes)]

    @staticmethod
    def _template(rng: random.Random, n: int, cluster: str, name: str) -> bytes:
        gpus = []
        for i in range(GPUS):
            gpu = gpu_record(rng, n, i, 0) | {"nvlink_tx_bytes_total": -1, "nvlink_rx_bytes_total": -2}
            gpus.append(gpu)
        nics = [nic_record(rng, d, 0) | {"tx_bytes_total": -3, "rx_bytes_total": -4, "xmit_wait_total": -5} for d in range(PORTS)]
        body = {"version": 1, "node": name, "cluster": cluster, "labels": {"job": f"job-{cluster}"},
                "agent": {"version": "bench", "driver": "550.54.15", "cuda": "12.4"},
                "samples": [{"ts": -9, "gpus": gpus, "nics": nics}]}
        text = json.dumps(body, separators=(",", ":")).replace("%", "%%")
        for marker, field in (("-1", "nv"), ("-2", "nv"), ("-3", "ib"), ("-4", "ib"), ("-5", "wait"), ("-9", "ts")):
            text = text.replace(f":{marker},", f":%({field})s,").replace(f":{marker}}}", f":%({field})s}}")
        return text.encode()

    def body(self, node: int, step: int, ts: float) -> bytes:
        values = {b"nv": b"%d" % (10**12 + step * 10**10), b"ib": b"%d" % (10**12 + step * 5 * 10**9), b"wait": b"%d" % (step * 1000),
                  b"ts": b"%.3f" % ts}
        return zlib.compress(self.templates[node] % values, 1, wbits=31)


class Replica:
    def __init__(self, url: str, name: str):
        self.port = _free_port()
        env = os.environ | {"LAGGARD_DATABASE_URL": url, "LAGGARD_PORT": str(self.port), "LAGGARD_REPLICA": name,
                            "LAGGARD_AUTH__INSECURE": "false", **CAPACITY_NOT_ADMISSION}
        self.process = subprocess.Popen([sys.executable, "-m", "server.cli", "--log-level", "warning", "server"], env=env)

    def wait_ready(self) -> None:
        _wait_ready(self.port)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(60)


def _agent_tokens(url: str, clusters: int) -> dict[str, str]:
    from server.auth.store import create_token
    from server.store import migrate
    from server.store.engine import make_engine

    engine = make_engine(url)
    try:
        migrate.upgrade(engine)
        with engine.begin() as conn:
            return {f"c{c}": create_token(conn, scopes=frozenset({"agent"}), name=f"bench-c{c}", cluster=f"c{c}")[0]
                    for c in range(clusters)}
    finally:
        engine.dispose()


class Pushes:
    """What the clients saw: latencies, failures, acknowledged GPU-samples, schedule slip."""

    def __init__(self):
        self.lock = threading.Lock()
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self.acked = 0
        self.max_slip = 0.0

    def record(self, latency: float, status: int, payload: bytes, slip: float) -> None:
        with self.lock:
            self.latencies.append(latency)
            self.max_slip = max(self.max_slip, slip)
            if status == 200:
                self.acked += json.loads(payload)["accepted"] * GPUS
            elif len(self.failures) < 20:
                self.failures.append(f"{status} {payload[:200]!r}")
            else:
                self.failures.append("")


def run(args, url: str, fleet: Fleet, tokens: dict[str, str], replicas: list[Replica]) -> dict:
    work: queue.Queue = queue.Queue(maxsize=4 * args.clients)
    pushes, stop = Pushes(), threading.Event()
    clients = [threading.Thread(target=_client, args=(replicas[i % len(replicas)].port, fleet, tokens, work, pushes), daemon=True)
               for i in range(args.clients)]
    for c in clients:
        c.start()
    timeline: list[dict] = []
    monitor = threading.Thread(target=_monitor, args=(url, replicas, stop, timeline), daemon=True)
    start = time.time() + 1.0
    monitor.start()
    _schedule(fleet, work, start, args.minutes * 60)
    for _ in clients:
        work.put(None)
    for c in clients:
        c.join()
    time.sleep(2 * MONITOR_EVERY_S)  # the detector catches up on the last pushes
    stop.set()
    monitor.join()
    return _summary(args, url, pushes, timeline)


def _schedule(fleet: Fleet, work: queue.Queue, start: float, duration: float) -> None:
    """Every node once per interval at its own phase, in time order; a full queue slows this
    thread down, which shows as slip."""
    order = sorted(range(len(fleet.nodes)), key=fleet.phase.__getitem__)
    step = 0
    while step * fleet.interval < duration:
        base = start + step * fleet.interval
        for node in order:
            due = base + fleet.phase[node]
            delay = due - time.time()
            if delay > 0:
                time.sleep(delay)
            work.put((node, step, due))
        step += 1


def _client(port: int, fleet: Fleet, tokens: dict[str, str], work: queue.Queue, pushes: Pushes) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    while (item := work.get()) is not None:
        node, step, due = item
        cluster = fleet.nodes[node][0]
        body = fleet.body(node, step, due)
        headers = {"Content-Type": "application/json", "Content-Encoding": "gzip", "Authorization": f"Bearer {tokens[cluster]}"}
        sent = time.time()
        try:
            conn.request("POST", "/api/v1/samples", body=body, headers=headers)
            resp = conn.getresponse()
            status, payload = resp.status, resp.read()
        except OSError as e:
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            status, payload = 0, repr(e).encode()
        pushes.record(time.time() - sent, status, payload, sent - due)
    conn.close()


_LAG_SQL = (
    "SELECT n.cluster, max(l.max_ts) FROM ingest_log l JOIN nodes n ON n.id = l.node_id "
    "WHERE l.id > (SELECT coalesce(max(id), 0) FROM ingest_log) - %(recent)s GROUP BY n.cluster"
)


def _monitor(url: str, replicas: list[Replica], stop: threading.Event, timeline: list[dict]) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        wal0 = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        t0 = time.time()
        while not stop.wait(MONITOR_EVERY_S):
            newest = dict(conn.execute(_LAG_SQL, {"recent": 100_000}).fetchall())
            judged = dict(conn.execute("SELECT substr(key, 14), value FROM detector_progress WHERE key LIKE 'judged_until:%'").fetchall())
            lags = [newest[c] - judged[c] for c in newest if c in judged]
            wal = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (wal0,)).fetchone()[0]
            timeline.append({"t": round(time.time() - t0, 1), "lag_s": round(max(lags), 1) if lags else None,
                             "rss_mb": [round(_tree_rss_mb(r.process.pid), 1) for r in replicas],
                             "postgres_cpu_s": round(_postgres_cpu_s(), 1), "wal_mb": round(float(wal) / 1e6, 1),
                             "db_mb": round(conn.execute("SELECT pg_database_size(current_database())").fetchone()[0] / 1e6, 1)})


def _postgres_cpu_s() -> float:
    total = 0.0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == "postgres":
                    total += _cpu_seconds_of(int(pid))
            except OSError:
                continue
    return total


def _stored_gpu_samples(url: str) -> int:
    import psycopg

    with psycopg.connect(url) as conn:
        return conn.execute("SELECT count(*) FROM gpu_samples").fetchone()[0]


def _per_second(timeline: list[dict], field: str) -> float | None:
    if len(timeline) < 2:
        return None
    first, last = timeline[0], timeline[-1]
    return round((last[field] - first[field]) / max(last["t"] - first["t"], 1e-9), 3)


def _summary(args, url: str, pushes: Pushes, timeline: list[dict]) -> dict:
    latencies = sorted(pushes.latencies)
    stored = _stored_gpu_samples(url)
    lags = sorted(t["lag_s"] for t in timeline[2:] if t["lag_s"] is not None)  # after the first pushes reached every node
    minutes = max(timeline[-1]["t"] / 60, 1e-9) if timeline else 1e-9
    summary = {
        "args": vars(args),
        "gpus": args.nodes * GPUS,
        "offered_gpu_samples_per_s": round(args.nodes * GPUS / args.interval, 1),
        "acked_gpu_samples": pushes.acked,
        "stored_gpu_samples": stored,
        "acked_equals_stored": stored == pushes.acked,
        "acked_gpu_samples_per_s": round(pushes.acked / (args.minutes * 60), 1),  # over the schedule
        "failed_pushes": len(pushes.failures),
        "first_failures": [f for f in pushes.failures[:5] if f],
        "push_p50_ms": round(_pct(latencies, 0.50) * 1000, 1) if latencies else None,
        "push_p99_ms": round(_pct(latencies, 0.99) * 1000, 1) if latencies else None,
        "max_schedule_slip_s": round(pushes.max_slip, 2),
        "detection_lag_p50_s": _pct(lags, 0.50) if lags else None,
        "detection_lag_p99_s": _pct(lags, 0.99) if lags else None,
        "detection_lag_last_s": lags[-1] if lags else None,
        "rss_mb_max_per_replica": [max(t["rss_mb"][i] for t in timeline) for i in range(args.replicas)] if timeline else None,
        "postgres_cpu_cores": _per_second(timeline, "postgres_cpu_s"),
        "wal_mb_per_minute": round(timeline[-1]["wal_mb"] / minutes, 1) if timeline else None,
        "database_growth_mb_per_minute": round(_per_second(timeline, "db_mb") * 60, 1) if len(timeline) > 1 else None,
        "timeline": timeline,
    }
    summary["held"] = not pushes.failures and summary["acked_equals_stored"] and pushes.max_slip <= args.interval
    return summary


if __name__ == "__main__":
    sys.exit(main())
