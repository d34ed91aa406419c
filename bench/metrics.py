"""Scrape benchmark (docs/observability.md): GET /metrics of a collector that knows 10,000 GPUs.

Builds a database the way a fleet leaves it: 1,250 nodes × 8 GPUs and 8 IB ports each, `--samples`
samples per GPU and port (the latest-sample lookup walks a real index), open episodes on 1% of
the GPUs, XID events, and the shared counters. Then starts the collector (real uvicorn) and
times whole scrapes over HTTP (`laggard server` in its own process), and, in-process, the parts: reading the database and building the
families, writing the text, and what prometheus_client's generic writer would take instead.

    python bench/metrics.py                          # SQLite in a temp dir, 10,000 GPUs
    python bench/metrics.py --database-url postgresql://postgres@127.0.0.1:5432/postgres
    python bench/metrics.py --gpus 1000 --rounds 3   # quicker
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
from sqlalchemy import insert  # noqa: E402

from agent.exposition import render  # noqa: E402
from server.app import create_app  # noqa: E402
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
            gpu_rows.append(tuple(row[c] for c in gpu_cols))
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


def run(url: str, *, gpus: int, samples: int, rounds: int) -> dict:
    now = time.time()
    t = time.perf_counter()
    shape = populate(url, gpus=gpus, samples=samples, now=now)
    print(f"populated {shape} with {samples} samples each in {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
    scrape, size, series = _scrape_server_process(url, rounds)
    # The parts, in this process, on the same database.
    settings = Settings(database_url=url, retention_interval_s=86400, insecure=True)
    server = start_in_thread(create_app(settings))
    try:
        app = server.server.config.app
        collector, renderer = app.state.metrics_collector, app.state.metrics_renderer
        renderer.render(collector.families())  # warm, as every scrape after the first is
        read, write, cold, cpu, reference = [], [], [], [], []
        for _ in range(rounds):
            t, c = time.perf_counter(), time.thread_time()
            families = collector.families()
            read.append(time.perf_counter() - t)
            t = time.perf_counter()
            renderer.render(families)
            write.append(time.perf_counter() - t)
            cpu.append(time.thread_time() - c)
            t = time.perf_counter()
            render(families)
            cold.append(time.perf_counter() - t)
        from prometheus_client import CollectorRegistry, generate_latest

        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        t = time.perf_counter()
        generate_latest(registry)
        reference.append(time.perf_counter() - t)
    finally:
        server.stop()
    return {
        **shape, "samples_per_series": samples, "series": series, "bytes": size,
        "scrape_s": {"median": statistics.median(scrape), "max": max(scrape)},
        "read_and_build_s": statistics.median(read), "render_s": statistics.median(write), "render_cold_s": statistics.median(cold),
        "cpu_s": statistics.median(cpu), "prometheus_client_generate_latest_s": reference[0],
    }


def _scrape_server_process(url: str, rounds: int) -> tuple[list[float], int, int]:
    """Whole scrapes of `laggard server` (its own process, as Prometheus sees it), over HTTP."""
    import os
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "server.cli", "--log-level", "warning", "server", "--database-url", url,
                             "--port", str(port)], cwd=Path(__file__).resolve().parent.parent,
                            # /metrics open, as a site that scrapes without a token would run it.
                            env=os.environ | {"PYTHONUNBUFFERED": "1", "LAGGARD_METRICS_PUBLIC": "true"})
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("collector did not start")
            time.sleep(0.2)
        with httpx.Client(timeout=60) as client:
            client.get(f"{base}/metrics")  # the first scrape fills the renderer's cache
            times, body = [], b""
            for _ in range(rounds):
                t = time.perf_counter()
                body = client.get(f"{base}/metrics").content
                times.append(time.perf_counter() - t)
        series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
        return times, len(body), series
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, default=10_000)
    p.add_argument("--samples", type=int, default=30, help="samples stored per GPU and port")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--database-url", default=None, help="PostgreSQL admin URL (a fresh database is made); default SQLite in a temp dir")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.database_url:
            from bench.ingest import _fresh_pg

            url = _fresh_pg(args.database_url, "metrics")
        else:
            url = f"sqlite:///{tmp}/metrics.db"
        result = run(url, gpus=args.gpus, samples=args.samples, rounds=args.rounds)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{result['gpus']:,} GPUs, {result['ports']:,} ports, {result['series']:,} series, {result['bytes'] / 1e6:.1f} MB: "
              f"scrape over HTTP median {result['scrape_s']['median']:.3f} s (max {result['scrape_s']['max']:.3f} s); "
              f"in-process: database + families {result['read_and_build_s']:.3f} s, text {result['render_s']:.3f} s "
              f"(first scrape {result['render_cold_s']:.3f} s), CPU {result['cpu_s']:.3f} s; "
              f"prometheus_client's writer would take {result['prometheus_client_generate_latest_s']:.3f} s for read + text")
    return 0


if __name__ == "__main__":
    sys.exit(main())
