"""Ingest benchmark (docs/performance.md).

End to end: a collector process (`laggard server`) on a fresh database, and concurrent keep-alive
clients pushing pre-encoded gzip bodies of a simulated fleet. Reports GPU-samples/s committed and
p50/p99 request latency. In the same run, the floor: one process, no HTTP, no validation, the
same rows written to the same kind of database. Prints the ratio end-to-end / floor.

- PostgreSQL: the raw-COPY floor. The bodies are decoded (gunzip + JSON) into rows first, untimed;
  then the rows go in by binary COPY straight into gpu_samples and nic_samples, one transaction
  per 10 bodies (a group commit's worth), and only the COPYs and commits are timed: what the
  database takes, nothing of Laggard's. The decoding time is printed beside it.
- SQLite (and PostgreSQL with --executemany-floor): gunzip + JSON + executemany, one
  transaction per body, timed together (the floor of earlier figures).

    python bench/ingest.py                      # SQLite
    python bench/ingest.py --database-url postgresql://postgres@127.0.0.1:5432/bench
    python bench/ingest.py --database-url postgresql://postgres@127.0.0.1:5432/bench --replicas 2

--replicas N runs N separate collector processes (`laggard server`, as N pods or hosts would) on
one database, the clients spread over them. On PostgreSQL the run also reports the storage the
sample tables take per GPU-sample (pg_total_relation_size over every partition, indexes and
TOAST included) after the whole run.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bodies import fleet_bodies  # noqa: E402

# Capacity, not admission, is measured: the request rate limit and the limits by work sized for
# the defaults' fleets (5,000 rows/s and 120 new nodes a minute per token, 10,000 rows/s per
# cluster; issue #12) are lifted, for the one token a bench's whole fleet pushes with.
CAPACITY_NOT_ADMISSION = {
    "LAGGARD_AUTH__RATE_LIMIT_PER_S": "1e9", "LAGGARD_AUTH__RATE_LIMIT_BURST": "1e9",
    **{f"LAGGARD_INGEST_LIMITS__{limit}": "1e9" for limit in (
        "ROWS_PER_S_PER_TOKEN", "ROWS_BURST_PER_TOKEN", "ROWS_PER_S_PER_CLUSTER", "ROWS_BURST_PER_CLUSTER",
        "NODE_REGISTRATIONS_PER_MIN_PER_TOKEN")},
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=64)
    p.add_argument("--requests-per-node", type=int, default=8)
    p.add_argument("--samples-per-request", type=int, default=10)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--nics", type=int, default=8, help="IB ports per node in each sample")
    p.add_argument("--workers", type=int, default=1, help="collector worker processes")
    p.add_argument("--replicas", type=int, default=1, help="separate collector processes (each with --workers workers)")
    p.add_argument("--with-detection", action="store_true",
                   help="keep the detector running in the collector (by default it is off: this measures ingest)")
    p.add_argument("--database-url", default=None, help="default: a fresh SQLite file in a temp dir")
    p.add_argument("--rounds", type=int, default=3, help="end-to-end and floor are alternated this many times; medians reported")
    p.add_argument("--executemany-floor", action="store_true",
                   help="PostgreSQL: also measure the executemany floor (one transaction per body) and print its ratio")
    args = p.parse_args()

    t0 = time.time() - 86400
    bodies = fleet_bodies(nodes=args.nodes, requests_per_node=args.requests_per_node,
                          samples_per_request=args.samples_per_request, nics=args.nics, t0=t0)
    gpu_samples = sum(_gpu_samples(b) for b in bodies)
    print(f"{len(bodies)} bodies, {gpu_samples} GPU-samples, {sum(map(len, bodies)) / len(bodies) / 1024:.1f} KiB gzip each")

    pg = bool(args.database_url)
    floors = ["copy"] if pg else ["executemany"]
    if pg and args.executemany_floor:
        floors.append("executemany")
    e2e, p50s, p99s = [], [], []
    floor: dict[str, list[float]] = {kind: [] for kind in floors}
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            url = pg and _fresh_pg(args.database_url, f"e2e{r}") or f"sqlite:///{tmp}/e2e.db"
            rate, lat = run_end_to_end(bodies, url, clients=args.clients, workers=args.workers, gpu_samples=gpu_samples,
                                       detection=args.with_detection, replicas=args.replicas)
            if pg:
                _report_size(url, gpu_samples)
            e2e.append(rate)
            p50s.append(lat[0])
            p99s.append(lat[1])
            for kind in floors:
                url = pg and _fresh_pg(args.database_url, f"floor{r}") or f"sqlite:///{tmp}/floor_{kind}.db"
                floor[kind].append((run_copy_floor if kind == "copy" else run_floor)(bodies, url, gpu_samples=gpu_samples))
        floors_now = "; ".join(f"{kind} floor {floor[kind][-1]:,.0f}" for kind in floors)
        print(f"round {r + 1}: end-to-end {e2e[-1]:,.0f} GPU-samples/s (p50 {p50s[-1]:.1f} ms, p99 {p99s[-1]:.1f} ms); "
              f"{floors_now} GPU-samples/s")
    med_e2e = statistics.median(e2e)
    print(f"median end-to-end: {med_e2e:,.0f} GPU-samples/s; p50 {statistics.median(p50s):.1f} ms; p99 {statistics.median(p99s):.1f} ms")
    for kind in floors:
        med_floor = statistics.median(floor[kind])
        print(f"median {kind} floor: {med_floor:,.0f} GPU-samples/s")
        print(f"ratio end-to-end / {kind} floor: {med_e2e / med_floor:.2f}")
    return 0


def _gpu_samples(body: bytes) -> int:
    return sum(len(s["gpus"]) for s in json.loads(gzip.decompress(body))["samples"])


def run_end_to_end(bodies: list[bytes], database_url: str, *, clients: int, workers: int, gpu_samples: int, detection: bool,
                   replicas: int = 1) -> tuple[float, tuple[float, float]]:
    ports = [_free_port() for _ in range(replicas)]
    servers = []
    token = _agent_token(database_url)
    for port in ports:
        # Authentication on, as deployed: every request carries an agent token (looked up once,
        # then cached). The limits are lifted: one token for the whole simulated fleet.
        env = os.environ | {"LAGGARD_DATABASE_URL": database_url, "LAGGARD_PORT": str(port), "LAGGARD_WORKERS": str(workers),
                            "LAGGARD_DETECTOR__ENABLED": "true" if detection else "false", "LAGGARD_AUTH__INSECURE": "false",
                            **CAPACITY_NOT_ADMISSION}
        servers.append(subprocess.Popen([sys.executable, "-m", "server.cli", "--log-level", "warning", "server"], env=env))
    try:
        for port in ports:
            _wait_ready(port)
        # Warm-up: register the fleet's nodes and GPUs so the timed part measures steady state.
        latencies: list[float] = []
        _post_all(bodies[: min(len(bodies), 64)], ports, clients, [], token)
        timed = bodies[64:] if len(bodies) > 128 else bodies
        timed_samples = gpu_samples * len(timed) // len(bodies)
        pids = [p for server in servers for p in [server.pid, *_children(server.pid)]]
        per_process0 = {p: _cpu_seconds_of(p) for p in pids}
        server_cpu0, client_cpu0 = sum(_cpu_seconds(s.pid) for s in servers), time.process_time()
        start = time.perf_counter()
        _post_all(timed, ports, clients, latencies, token)
        elapsed = time.perf_counter() - start
        server_cpu = (sum(_cpu_seconds(s.pid) for s in servers) - server_cpu0) / elapsed
        client_cpu = (time.process_time() - client_cpu0) / elapsed
        per_process = [(_cpu_seconds_of(p) - c0) / elapsed for p, c0 in per_process0.items()]
        print(f"  cpu during the timed part: collector {server_cpu:.2f} cores "
              f"({' + '.join(f'{c:.2f}' for c in per_process)} by process), load generator {client_cpu:.2f} cores")
    finally:
        for server in servers:
            server.terminate()
        for server in servers:
            server.wait(30)
    latencies.sort()
    p50 = latencies[len(latencies) // 2] * 1000
    p99 = latencies[int(len(latencies) * 0.99) - 1] * 1000
    return timed_samples / elapsed, (p50, p99)


def _agent_token(database_url: str) -> str:
    from server.auth.store import create_token
    from server.store import migrate
    from server.store.engine import make_engine

    engine = make_engine(database_url)
    try:
        migrate.upgrade(engine)
        with engine.begin() as conn:
            return create_token(conn, scopes=frozenset({"agent"}), name="bench", cluster="bench")[0]
    finally:
        engine.dispose()


def _post_all(bodies: list[bytes], ports: list[int], clients: int, latencies: list[float], token: str) -> None:
    work = iter(bodies)
    lock = threading.Lock()
    errors: list[str] = []

    def client(port: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        headers = {"Content-Type": "application/json", "Content-Encoding": "gzip", "Authorization": f"Bearer {token}"}
        while True:
            with lock:
                body = next(work, None)
            if body is None:
                break
            t = time.perf_counter()
            conn.request("POST", "/api/v1/samples", body=body, headers=headers)
            resp = conn.getresponse()
            payload = resp.read()
            dt = time.perf_counter() - t
            if resp.status != 200:
                errors.append(f"{resp.status} {payload[:200]!r}")
            with lock:
                latencies.append(dt)
        conn.close()

    threads = [threading.Thread(target=client, args=(ports[i % len(ports)],)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit(f"{len(errors)} requests failed, first: {errors[0]}")


def _positional_insert_ignore_sql(dialect_name: str, table) -> str:
    """INSERT ... ON CONFLICT DO NOTHING as driver SQL with positional parameters, for
    executemany over tuples: the floor measures the database, not the building of dicts."""
    placeholder = {"sqlite": "?", "postgresql": "%s"}[dialect_name]
    columns = [c.name for c in table.columns]
    quoted = ", ".join(f'"{c}"' for c in columns)
    marks = ", ".join(placeholder for _ in columns)
    return f'INSERT INTO "{table.name}" ({quoted}) VALUES ({marks}) ON CONFLICT DO NOTHING'


def run_floor(bodies: list[bytes], database_url: str, *, gpu_samples: int) -> float:
    """The executemany floor. No HTTP, no validation: gunzip + json.loads + executemany, one
    transaction per body."""
    from server.protocol import GPU_METRICS, NIC_METRICS
    from server.store import migrate
    from server.store.engine import make_engine
    from server.store.schema import GpuSample, NicSample

    engine = make_engine(database_url)
    migrate.upgrade(engine)
    gpu_sql = _positional_insert_ignore_sql(engine.dialect.name, GpuSample.__table__)
    nic_sql = _positional_insert_ignore_sql(engine.dialect.name, NicSample.__table__)
    raw = engine.raw_connection()
    _FLOOR_NODES.clear()
    gpu_ids: dict[str, int] = {}
    nic_ids: dict[tuple[str, str], int] = {}
    try:
        warm = bodies[: min(len(bodies), 64)]
        timed = bodies[64:] if len(bodies) > 128 else bodies
        for body in warm:
            _floor_insert(raw, body, gpu_sql, nic_sql, gpu_ids, nic_ids, GPU_METRICS, NIC_METRICS)
        start = time.perf_counter()
        for body in timed:
            _floor_insert(raw, body, gpu_sql, nic_sql, gpu_ids, nic_ids, GPU_METRICS, NIC_METRICS)
        elapsed = time.perf_counter() - start
    finally:
        raw.close()
        engine.dispose()
    return gpu_samples * len(timed) // len(bodies) / elapsed


def _floor_insert(raw, body, gpu_sql, nic_sql, gpu_ids, nic_ids, gpu_metrics, nic_metrics) -> None:
    # The floor still needs inventory rows for the foreign keys: numbered in memory, inserted once.
    cur = raw.cursor()
    gpu_rows, nic_rows = _floor_rows(cur, body, gpu_ids, nic_ids, gpu_metrics, nic_metrics)
    cur.executemany(gpu_sql, gpu_rows)
    cur.executemany(nic_sql, nic_rows)
    raw.commit()


_FLOOR_NODES: dict[str, int] = {}

COPY_FLOOR_BODIES_PER_TRANSACTION = 10


def run_copy_floor(bodies: list[bytes], database_url: str, *, gpu_samples: int) -> float:
    """The raw-COPY floor: the bodies' rows, decoded beforehand (gunzip + JSON, no validation),
    by binary COPY straight into the sample tables (no staging, no conflict handling: the
    database is fresh), one transaction per COPY_FLOOR_BODIES_PER_TRANSACTION bodies; only the
    COPYs and commits are timed."""
    import psycopg

    from server.protocol import GPU_METRICS, NIC_METRICS
    from server.store import migrate
    from server.store.engine import make_engine
    from server.store.pg_copy import copy_types
    from server.store.schema import GpuSample, NicSample

    engine = make_engine(database_url)
    migrate.upgrade(engine)
    engine.dispose()
    _FLOOR_NODES.clear()
    gpu_ids: dict[str, int] = {}
    nic_ids: dict[tuple[str, str], int] = {}
    gpu_types, nic_types = copy_types(GpuSample.__table__), copy_types(NicSample.__table__)
    with psycopg.connect(database_url) as conn:
        decode_start = time.perf_counter()
        with conn.cursor() as cur:  # registering the inventory, as the floor above does, untimed
            rows = [_floor_rows(cur, body, gpu_ids, nic_ids, GPU_METRICS, NIC_METRICS) for body in bodies]
        conn.commit()
        decode_s = time.perf_counter() - decode_start
        warm, timed = (rows[:64], rows[64:]) if len(rows) > 128 else ([], rows)
        _copy_in_groups(conn, warm, gpu_types, nic_types)
        start = time.perf_counter()
        _copy_in_groups(conn, timed, gpu_types, nic_types)
        elapsed = time.perf_counter() - start
    timed_samples = gpu_samples * len(timed) // len(bodies)
    print(f"  raw-COPY floor: {timed_samples / elapsed:,.0f} GPU-samples/s ({elapsed:.2f} s); decoding the rows beforehand "
          f"(gunzip + JSON, inventory registered) took {decode_s / len(bodies) * 1000:.2f} ms per body, not counted")
    return timed_samples / elapsed


def _copy_in_groups(conn, rows: list[tuple[list, list]], gpu_types: list[str], nic_types: list[str]) -> None:
    for first in range(0, len(rows), COPY_FLOOR_BODIES_PER_TRANSACTION):
        group = rows[first:first + COPY_FLOOR_BODIES_PER_TRANSACTION]
        with conn.cursor() as cur:
            for table, types, index in (("gpu_samples", gpu_types, 0), ("nic_samples", nic_types, 1)):
                with cur.copy(f"COPY {table} FROM STDIN (FORMAT BINARY)") as copy:
                    copy.set_types(types)
                    for body_rows in group:
                        for row in body_rows[index]:
                            copy.write_row(row)
        conn.commit()


def _floor_rows(cur, body, gpu_ids, nic_ids, gpu_metrics, nic_metrics) -> tuple[list, list]:
    """A body's GPU and port rows in table column order (no validation), its inventory registered."""
    doc = json.loads(gzip.decompress(body))
    gpu_rows, nic_rows = [], []
    for s in doc["samples"]:
        ts = s["ts"]
        for g in s["gpus"]:
            gid = gpu_ids.get(g["uuid"])
            if gid is None:
                gid = gpu_ids[g["uuid"]] = _register(cur, "gpus", doc["node"], g["uuid"], len(gpu_ids) + 1, ts)
            gpu_rows.append((gid, ts, g.get("lost", False), *[g.get(m) for m in gpu_metrics[1:]]))
        for n in s["nics"]:
            key = (doc["node"], n["device"])
            nid = nic_ids.get(key)
            if nid is None:
                nid = nic_ids[key] = _register(cur, "nics", doc["node"], n["device"], len(nic_ids) + 1, ts)
            nic_rows.append((nid, ts, *[n.get(m) for m in nic_metrics]))
    return gpu_rows, nic_rows


def _register(cur, table: str, node: str, key: str, new_id: int, ts: float) -> int:
    ph = "?" if type(cur).__module__.startswith("sqlite3") else "%s"
    node_id = _FLOOR_NODES.get(node)
    if node_id is None:
        node_id = _FLOOR_NODES[node] = len(_FLOOR_NODES) + 1
        cur.execute(f"INSERT INTO nodes (id, cluster, name, labels, first_seen, last_seen) VALUES ({ph}, 'bench', {ph}, '{{}}', {ph}, {ph})",
                    (node_id, node, ts, ts))
    if table == "gpus":
        cur.execute(f'INSERT INTO gpus (id, uuid, node_id, "index", first_seen) VALUES ({ph}, {ph}, {ph}, 0, {ph})', (new_id, key, node_id, ts))
    else:
        cur.execute(f"INSERT INTO nics (id, node_id, device, port, first_seen) VALUES ({ph}, {ph}, {ph}, 1, {ph})", (new_id, node_id, key, ts))
    return new_id


def _cpu_seconds(pid: int) -> float:
    """CPU seconds of a process and its children still running (uvicorn workers)."""
    return sum(_cpu_seconds_of(p) for p in [pid, *_children(pid)])


def _cpu_seconds_of(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    try:
        kids = [int(k) for k in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
    return kids + [g for k in kids for g in _children(k)]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(port: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/readyz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("collector did not become ready")


# A partitioned table's own size is 0: sum its partitions (pg_partition_tree lists nothing for a plain table).
_SIZE_SQL = ("SELECT CASE WHEN EXISTS (SELECT 1 FROM pg_partitioned_table WHERE partrelid = %(t)s::regclass) "
             "THEN (SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree(%(t)s::regclass)) "
             "ELSE pg_total_relation_size(%(t)s::regclass) END")


def _report_size(database_url: str, gpu_samples: int) -> None:
    """Bytes the sample tables take per stored GPU-sample (its node's NIC samples included)."""
    import psycopg

    with psycopg.connect(database_url) as conn:
        sizes = {t: conn.execute(_SIZE_SQL, {"t": t}).fetchone()[0] for t in ("gpu_samples", "nic_samples")}
        rows = {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in sizes}
    per_gpu_sample = sum(sizes.values()) / rows["gpu_samples"]
    print(f"  storage: gpu_samples {sizes['gpu_samples'] / rows['gpu_samples']:.0f} B/row ({rows['gpu_samples']} rows), "
          f"nic_samples {sizes['nic_samples'] / max(rows['nic_samples'], 1):.0f} B/row ({rows['nic_samples']} rows); "
          f"{per_gpu_sample:.0f} B per GPU-sample with its share of NIC samples")


def fresh_database(admin_url: str | None, tmp: str, name: str) -> str:
    """A fresh database for a bench run: one made on the PostgreSQL server at `admin_url`, or a
    SQLite file in `tmp`."""
    return _fresh_pg(admin_url, name) if admin_url else f"sqlite:///{tmp}/{name}.db"


def _fresh_pg(admin_url: str, suffix: str) -> str:
    import psycopg

    name = f"laggard_bench_{suffix}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    return admin_url.rsplit("/", 1)[0] + "/" + name


if __name__ == "__main__":
    sys.exit(main())
