"""Detector scale benchmark (docs/operations.md, "Scaling and sizing").

Feeds the detector engine (server/detect/engine.py) one fleet of N GPUs (8 per node, 8 IB ports
per node, one peer group, a few GPUs running hot) instant after instant, as the detection
service does after reading them from the database, and reports the wall and CPU time of judging
one evaluation window (one sample instant of the whole fleet) and the peak memory the
process reaches (run sizes separately for a clean figure per size). With --service the fleet
is written to a database first (SQLite, or --database-url) and each window is read back as the
detection service reads it (server/detect/source.py: the ingest log, then the rows behind it);
the storage read and the engine are then reported separately, and end to end.

    python bench/scale.py                         # 10,000 and 100,000 GPUs
    python bench/scale.py --gpus 10000 --instants 6
    python bench/scale.py --gpus 10000 --warm 13 --service
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bodies import gpu_record, nic_record  # noqa: E402
from server.detect.engine import Detector, NodeInstant  # noqa: E402
from server.detect.settings import DetectionSettings  # noqa: E402
from server.store.engine import SQLITE_MMAP_MB  # noqa: E402

CLUSTER = "bench"
HOT_EVERY = 997  # one GPU in ~1,000 runs hot (clocks down, HW thermal slowdown)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, action="append", help="fleet size (repeatable); default 10,000 and 100,000")
    p.add_argument("--instants", type=int, default=3, help="evaluation windows timed (after the warm-up)")
    p.add_argument("--interval", type=float, default=5.0, help="sample interval, seconds of sample time")
    p.add_argument("--nics", type=int, default=8, help="IB ports per node")
    p.add_argument("--warm", type=int, default=120, help="instants replayed first (120 fills every window, as in steady state)")
    p.add_argument("--service", action="store_true", help="read each window back from a database, as the service does")
    p.add_argument("--database-url", help="with --service: this database (default: a fresh SQLite file)")
    p.add_argument("--sqlite-mmap-mb", type=int, default=SQLITE_MMAP_MB, help="with --service on SQLite: LAGGARD_SQLITE_MMAP_MB")
    args = p.parse_args()
    for gpus in args.gpus or [10_000, 100_000]:
        if args.service:
            run_service(gpus, instants=args.instants, interval=args.interval, nics=args.nics, warm=args.warm, url=args.database_url,
                        mmap_mb=args.sqlite_mmap_mb)
        else:
            run(gpus, instants=args.instants, interval=args.interval, nics=args.nics, warm=args.warm)
    return 0


class FleetRows:
    """Rows of every node at any instant: a few noisy variants of each GPU's and port's
    readings drawn once, counters advanced per step (drawing every reading afresh would make
    generating the input slower than judging it)."""

    VARIANTS = 7
    TEMPLATE_NODES = 64

    def __init__(self, nodes: int, nics: int, rng: random.Random):
        self.nodes, self.nics = nodes, nics
        # Scalars only, as stored (_as_read): the records' lists would make the input itself
        # hundreds of thousands of objects for the cyclic GC to walk, which the service has not.
        # Drawn for TEMPLATE_NODES nodes and shared by the others under their own GPU names: the
        # variants of every node were 1 GB of the process at 100,000 GPUs, which no service holds.
        self.gpus = [[[_scalars(gpu_record(rng, n, i, 0)) for _ in range(self.VARIANTS)] for i in range(8)]
                     for n in range(min(nodes, self.TEMPLATE_NODES))]
        self.uuids = [[f"GPU-{n:05d}-{i:02d}-bench" for i in range(8)] for n in range(nodes)]
        self.ports = [[nic_record(rng, d, 1) for d in range(nics)] for _ in range(min(nodes, 64))]

    def instant(self, step: int, ts: float) -> list[NodeInstant]:
        items = []
        nvlink = 10**12 + step * 10**10
        for n in range(self.nodes):
            name = f"node-{n:05d}"
            common = {"ts": ts, "cluster": CLUSTER, "node": name}
            gpu_rows = []
            templates, uuids = self.gpus[n % len(self.gpus)], self.uuids[n]
            for i in range(8):
                row = _as_read(templates[i][(step + n + i) % self.VARIANTS] | common)  # its own time and names, as read
                row["uuid"] = _fresh(uuids[i])
                row["lost"] = False
                row["nvlink_tx_bytes_total"] = row["nvlink_rx_bytes_total"] = nvlink
                if (n * 8 + i) % HOT_EVERY == 0 and step >= 2:
                    row |= {"sm_clock_mhz": 1400, "temp_c": 92.0, "clocks_event_reasons": 0x40, "util_gpu_pct": 100.0}
                gpu_rows.append(row)
            nic_rows = []
            for d, port in enumerate(self.ports[n % len(self.ports)]):
                row = _as_read(port | common)
                row["tx_bytes_total"] = row["rx_bytes_total"] = 10**12 + step * (10**9 + d * 10**7)
                row["xmit_wait_total"] = step * 1000
                nic_rows.append(row)
            items.append(NodeInstant(CLUSTER, name, {"job": "bench"}, ts, gpu_rows, nic_rows))
        return items


def _scalars(record: dict) -> dict:
    return {k: v for k, v in record.items() if type(v) is not list}


def _as_read(record: dict) -> dict:
    """The record as a database driver returns its row: a float object of its own for every
    float and every string, so that windows hold what a detector reading rows back holds
    (sharing the variants' floats made the windows look a third smaller than the service's), and scalars only (a
    GPU's XIDs are read from their own table: a list in every row made each row, which the
    detector keeps as its previous one, an object for the cyclic GC to walk, as no row the
    service reads is)."""
    return {k: v + 0.0 if type(v) is float else _fresh(v) if type(v) is str else v for k, v in record.items() if type(v) is not list}


def _fresh(text: str) -> str:
    """An equal string of its own, as a driver returns for every text column of every row."""
    return text.encode().decode()


def current_rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def run(gpus: int, *, instants: int, interval: float, nics: int, warm: int) -> None:
    nodes = gpus // 8
    fleet = FleetRows(nodes, nics, random.Random(7))
    before = current_rss()  # the input's variants, before the detector holds anything
    detector = Detector(DetectionSettings(open_after_s=0))
    t0 = 1_800_000_000.0
    # Warm-up as a restarted detector does it (Detector.warm: windows filled, nothing judged),
    # so the timed windows are judged against full windows, as in steady state.
    for step in range(warm):
        for item in fleet.instant(step, t0 + step * interval):
            detector.warm(item)
    for n in range(nodes):
        detector.resume_at(CLUSTER, f"node-{n:05d}", t0 + (warm - 1) * interval)
    walls, cpus, changes = [], [], 0
    for step in range(warm, warm + instants + 1):
        # Instant `step` arrives from every node and is judged, node by node.
        for item in fleet.instant(step, t0 + step * interval):
            detector.add(item)
        wall, cpu = time.perf_counter(), time.process_time()
        changes += len(detector.advance())
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        if step > warm:
            walls.append(wall)
            cpus.append(cpu)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # the process's peak so far
    wall, cpu = statistics.median(walls), statistics.median(cpus)
    print(f"{gpus:,} GPUs ({nodes:,} nodes, {nodes * nics:,} ports): one window {wall:.2f} s wall, {cpu:.2f} s CPU "
          f"(median of {len(walls)}); {gpus / cpu:,.0f} GPU-samples per CPU-second; "
          f"peak RSS {peak / 2**20:,.0f} MiB (the whole process, input instants included; {before / 2**20:,.0f} MiB before the "
          f"detector was made); {changes} episode changes")
    # Each evaluation's own: one that judged an aligned window between nodes (every
    # across_window_s of sample time) costs several times the others, and a median hides it.
    print("  CPU s per evaluation: " + " ".join(f"{c:.2f}" for c in cpus))


def run_service(gpus: int, *, instants: int, interval: float, nics: int, warm: int, url: str | None, mmap_mb: int = SQLITE_MMAP_MB) -> None:
    from bench.scale_store import FleetWriter, database
    from server.detect.source import LogCursor, load_instants, take_clusters

    nodes = gpus // 8
    fleet = FleetRows(nodes, nics, random.Random(7))
    detector = Detector(DetectionSettings(open_after_s=0))
    t0 = 1_800_000_000.0
    with database(url, sqlite_mmap_mb=mmap_mb) as engine:
        writer = FleetWriter(engine)
        for step in range(warm):
            items = fleet.instant(step, t0 + step * interval)
            writer.write(items)
            for item in items:
                detector.warm(item)
        for n in range(nodes):
            detector.resume_at(CLUSTER, f"node-{n:05d}", t0 + (warm - 1) * interval)
        for step in range(warm, warm + instants + 1):
            writer.write(fleet.instant(step, t0 + step * interval))
        cursor = LogCursor(low_water=warm * nodes)
        reads, judges = [], []
        with engine.connect() as conn:
            for step in range(warm, warm + instants + 1):
                cpu = time.process_time()
                entries = take_clusters(conn, {CLUSTER: cursor}, limit=nodes)[CLUSTER]
                items = load_instants(conn, entries)
                read = time.process_time() - cpu
                assert len(items) == nodes, (len(items), nodes)
                cpu = time.process_time()
                for item in items:
                    detector.add(item)
                detector.advance()
                judge = time.process_time() - cpu
                if step > warm:
                    reads.append(read)
                    judges.append(judge)
    read, judge = statistics.median(reads), statistics.median(judges)
    print(f"{gpus:,} GPUs ({nodes:,} nodes, {nodes * nics:,} ports), {engine.dialect.name}: one window read back {read:.2f} s CPU, "
          f"judged {judge:.2f} s CPU (medians of {len(reads)}); end to end {gpus / (read + judge):,.0f} GPU-samples per CPU-second "
          f"(storage read alone {gpus / read:,.0f}, engine alone {gpus / judge:,.0f})")


if __name__ == "__main__":
    sys.exit(main())
