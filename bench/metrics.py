"""Scrape benchmark (docs/observability.md): GET /metrics of a collector that knows 10,000 GPUs.

Builds a database the way a fleet leaves it: 1,250 nodes × 8 GPUs and 8 IB ports each, `--samples`
samples per GPU and port (the latest-sample lookup walks a real index), open episodes on 1% of
the GPUs, XID events, and the shared counters. Then starts the collector (real uvicorn) and
times whole scrapes over HTTP (`laggard server` in its own process), and, in-process, the parts: reading the database and building the
families, writing the text, and what prometheus_client's generic writer would take instead.

    python bench/metrics.py                          # SQLite in a temp dir, 10,000 GPUs
    python bench/metrics.py --database-url postgresql://postgres@127.0.0.1:5432/postgres
    python bench/metrics.py --gpus 1000 --rounds 3   # quicker
    python bench/metrics.py --gpus 100000 --samples 3 --query "shard=0&shards=8"   # one of 8 scrape targets
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qsl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402
from sqlalchemy import insert  # noqa: E402

from agent.exposition import render  # noqa: E402
from server.app import create_app  # noqa: E402
from server.metrics.runtime import renderer_for  # noqa: E402
from server.metrics.selection import parse_selection  # noqa: E402
from server.serve import start_in_thread  # noqa: E402
from server.settings import Settings  # noqa: E402
from server.store import counters, migrate, schema  # noqa: E402
from server.store.engine import make_engine  # noqa: E402

GPUS_PER_NODE = 8
PORTS_PER_NODE = 8


def populate(url: str, *, gpus: int, samples: int, now: float, seed: int = 0) -> dict[str, int]:
    rng = random.Random(seed)
    engine = make_engine(url)
    migrate.upgrade(engine)
    nodes = gpus // GPUS_PER_NODE
    t_first = now - samples * 5.0
    with engine.begin() as conn:
        conn.execute(insert(schema.Node.__table__), [
            {"id": n + 1, "cluster": f"c{n % 4}", "name": f"gpu-node-{n:05d}", "labels": {"job": f"job-{n // 64}"},
             "agent": {"version": "0.1.0", "driver": "550.54.15", "cuda": "12.4"}, "first_seen": t_first, "last_seen": now - 2}
            for n in range(nodes)])
        conn.execute(insert(schema.Gpu.__table__), [
            {"id": g + 1, "uuid": f"GPU-{g:08d}", "node_id": g // GPUS_PER_NODE + 1, "index": g % GPUS_PER_NODE,
             "model": "NVIDIA H100 80GB HBM3", "pci_bus_id": f"00000000:{0x18 + g % GPUS_PER_NODE:02X}:00.0", "first_seen": t_first}
            for g in range(nodes * GPUS_PER_NODE)])
        conn.execute(insert(schema.Nic.__table__), [
            {"id": p + 1, "node_id": p // PORTS_PER_NODE + 1, "device": f"mlx5_{p % PORTS_PER_NODE}", "port": 1, "first_seen": t_first}
            for p in range(nodes * PORTS_PER_NODE)])
    gpu_cols = [c.name for c in schema.GpuSample.__table__.columns]
    nic_cols = [c.name for c in schema.NicSample.__table__.columns]
    for k in range(samples):
        ts = t_first + 5.0 * (k + 1) - 2
        gpu_rows = []
        for g in range(nodes * GPUS_PER_NODE):
            row = {
                "gpu_id": g + 1, "ts": ts, "lost": False, "temp_c": 55 + rng.random() * 20, "mem_temp_c": 60 + rng.random() * 10,
                "power_w": 600 + rng.random() * 80, "power_limit_w": 700.0, "sm_clock_mhz": 1900 + rng.randrange(80),
                "sm_clock_max_mhz": 1980, "mem_clock_mhz": 2619, "mem_clock_max_mhz": 2619, "util_gpu_pct": 99.0, "util_mem_pct": 40.0,
                "mem_used_bytes": 60 << 30, "mem_total_bytes": 80 << 30, "clocks_event_reasons": 4, "pcie_gen": 5, "pcie_gen_max": 5,
                "pcie_width": 16, "pcie_width_max": 16, "pcie_replay_total": 0, "pcie_tx_bytes_per_s": 1e9, "pcie_rx_bytes_per_s": 1e9,
                "nvlink_links_up": 18, "nvlink_links_total": 18, "nvlink_tx_bytes_total": k * 10**11, "nvlink_rx_bytes_total": k * 10**11,
                "nvlink_crc_errors_total": 0, "nvlink_replay_errors_total": 0, "nvlink_recovery_errors_total": 0,
                "ecc_corrected_total": 3, "ecc_uncorrected_total": 0, "remapped_rows_pending": False,
                "tensor_active_pct": 45 + rng.random() * 20,
            }
            gpu_rows.append(tuple(row.get(c) for c in gpu_cols))  # columns added since: NULL, as from an older agent
        nic_rows = [
            tuple({"nic_id": p + 1, "ts": ts, "state": "ACTIVE", "rate_gbps": 400.0, "tx_bytes_total": k * 10**10,
                   "rx_bytes_total": k * 10**10, "symbol_errors_total": 0, "link_downed_total": 0, "rcv_errors_total": 0,
                   "xmit_discards_total": 0, "xmit_wait_total": k * 100}[c] for c in nic_cols)
            for p in range(nodes * PORTS_PER_NODE)]
        with engine.begin() as conn:
            _bulk(conn, "gpu_samples", gpu_cols, gpu_rows)
            _bulk(conn, "nic_samples", nic_cols, nic_rows)
    open_eps = max(1, gpus // 100)
    with engine.begin() as conn:
        conn.execute(insert(schema.Episode.__table__), [
            {"cluster": f"c{(g // GPUS_PER_NODE) % 4}", "node": f"gpu-node-{g // GPUS_PER_NODE:05d}", "gpu": g % GPUS_PER_NODE,
             "uuid": f"GPU-{g:08d}", "entity": f"gpu:GPU-{g:08d}", "cause": "thermal", "severity": "warning", "onset": now - 60,
             "detected_at": now - 55, "resolved_at": None, "summary": "hot", "evidence": {"clock_deviation": -0.12}}
            for g in rng.sample(range(nodes * GPUS_PER_NODE), open_eps)])
        conn.execute(insert(schema.XidEvent.__table__), [
            {"gpu_id": g + 1, "xid": 79, "ts": now - 100} for g in rng.sample(range(nodes * GPUS_PER_NODE), max(1, gpus // 200))])
        counters.add(conn, [("laggard_ingest_samples_total", {"cluster": f"c{c}"}, 1e6) for c in range(4)])
    engine.dispose()
    return {"nodes": nodes, "gpus": nodes * GPUS_PER_NODE, "ports": nodes * PORTS_PER_NODE, "open_episodes": open_eps}


def _bulk(conn, table: str, cols: list[str], rows: list[tuple]) -> None:
    placeholder = "?" if conn.dialect.name == "sqlite" else "%s"
    sql = f'INSERT INTO {table} ({", ".join(chr(34) + c + chr(34) for c in cols)}) VALUES ({", ".join(placeholder for _ in cols)})'
    conn.exec_driver_sql(sql, rows)


def run(url: str, *, gpus: int, samples: int, rounds: int, query: str = "", gzip: bool = True) -> dict:
    """`query`: a slice of the fleet (docs/observability.md), e.g. "shard=0&shards=8"; "" the whole."""
    now = time.time()
    t = time.perf_counter()
    shape = populate(url, gpus=gpus, samples=samples, now=now)
    print(f"populated {shape} with {samples} samples each in {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
    scrape, size, wire, series, rss = _scrape_server_process(url, rounds, f"?{query}" if query else "", gzip=gzip)
    selection = parse_selection(parse_qsl(query, keep_blank_values=True))
    # The parts, in this process, on the same database.
    settings = Settings(database_url=url, retention_interval_s=86400, insecure=True)
    server = start_in_thread(create_app(settings))
    try:
        app = server.server.config.app
        metrics = app.state.services.metrics
        collector, renderer = metrics.collector, renderer_for(metrics.instruments, selection)
        renderer.render(collector.families(selection))  # warm, as every scrape after the first is
        read, write, cold, cpu, reference = [], [], [], [], []
        for _ in range(rounds):
            t, c = time.perf_counter(), time.thread_time()
            families = collector.families(selection)
            read.append(time.perf_counter() - t)
            t = time.perf_counter()
            renderer.render(families)
            write.append(time.perf_counter() - t)
            cpu.append(time.thread_time() - c)
            t = time.perf_counter()
            render(families)
            cold.append(time.perf_counter() - t)
        from prometheus_client import CollectorRegistry, generate_latest

        if selection.whole:
            registry = CollectorRegistry(auto_describe=False)
            registry.register(collector)
            t = time.perf_counter()
            generate_latest(registry)
            reference.append(time.perf_counter() - t)
    finally:
        server.stop()
    return {
        **shape, "samples_per_series": samples, "series": series, "bytes": size, "wire_bytes": wire, "gzip": gzip, "server_peak_rss_bytes": rss,
        "scrape_s": {"median": statistics.median(scrape), "max": max(scrape)},
        "read_and_build_s": statistics.median(read), "render_s": statistics.median(write), "render_cold_s": statistics.median(cold),
        "cpu_s": statistics.median(cpu), "prometheus_client_generate_latest_s": reference[0] if reference else None, "query": query,
    }


def _peak_rss_bytes(pid: int) -> int:
    """The process's peak resident set (VmHWM, Linux), 0 where /proc does not say."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@contextlib.contextmanager
def collector_process(url: str, *, env: dict[str, str] | None = None) -> Iterator[tuple[str, subprocess.Popen]]:
    """`laggard server` on `url` in its own process (as Prometheus or kube-scheduler sees it):
    its base URL and process, once /healthz answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "server.cli", "--log-level", "warning", "server", "--database-url", url,
                             "--port", str(port)], cwd=Path(__file__).resolve().parent.parent,
                            env=os.environ | {"PYTHONUNBUFFERED": "1"} | (env or {}))
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("collector did not start")
            time.sleep(0.2)
        yield base, proc
    finally:
        proc.terminate()
        proc.wait(30)


def _scrape_server_process(url: str, rounds: int, query: str = "", *, gzip: bool = True) -> tuple[list[float], int, int, int, int]:
    """Whole scrapes of `laggard server` over HTTP, gzipped as Prometheus asks for them (or not):
    times, bytes, bytes on the wire and series of the last one, and the server's peak RSS."""
    # /metrics open, as a site that scrapes without a token would run it.
    headers = {"Accept-Encoding": "gzip" if gzip else "identity"}
    with (collector_process(url, env={"LAGGARD_METRICS_PUBLIC": "true"}) as (base, proc),
          httpx.Client(timeout=120, headers=headers) as client):
        client.get(f"{base}/metrics{query}")  # the first scrape fills the renderer's cache
        times, body, wire = [], b"", 0
        for _ in range(rounds):
            t = time.perf_counter()
            response = client.get(f"{base}/metrics{query}")
            body = response.content  # gunzipped by httpx, timed with the scrape as Prometheus does it
            times.append(time.perf_counter() - t)
            wire = response.num_bytes_downloaded
        series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
        return times, len(body), wire, series, _peak_rss_bytes(proc.pid)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, default=10_000)
    p.add_argument("--samples", type=int, default=30, help="samples stored per GPU and port")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--database-url", default=None, help="PostgreSQL admin URL (a fresh database is made); default SQLite in a temp dir")
    p.add_argument("--query", default="", help='scrape a slice: "shard=0&shards=8", "cluster=c1" (docs/observability.md)')
    p.add_argument("--no-gzip", action="store_true", help="scrape uncompressed (Accept-Encoding: identity)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        from bench.ingest import fresh_database

        url = fresh_database(args.database_url, tmp, "metrics")
        result = run(url, gpus=args.gpus, samples=args.samples, rounds=args.rounds, query=args.query, gzip=not args.no_gzip)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{result['gpus']:,} GPUs, {result['ports']:,} ports, {result['series']:,} series, {result['bytes'] / 1e6:.1f} MB "
              f"({result['wire_bytes'] / 1e6:.1f} MB on the wire): "
              f"scrape over HTTP median {result['scrape_s']['median']:.3f} s (max {result['scrape_s']['max']:.3f} s), "
              f"server peak RSS {result['server_peak_rss_bytes'] / 2**20:.0f} MiB; "
              f"in-process: database + families {result['read_and_build_s']:.3f} s, text {result['render_s']:.3f} s "
              f"(first scrape {result['render_cold_s']:.3f} s), CPU {result['cpu_s']:.3f} s"
              + (f"; prometheus_client's writer would take {result['prometheus_client_generate_latest_s']:.3f} s for read + text"
                 if result["prometheus_client_generate_latest_s"] is not None else f" (slice {result['query']})"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
