"""What one detection cycle costs when a maximum-size batch arrives hours late
(docs/reliability.md, "Hostile agents"): 1,000 samples x 64 GPUs stamped two hours back, beside
four live nodes. The detector drops every instant of it as late; since 2026-12-06 it does so
from the ingest log's entry, before reading the rows (`--read-all`: read them back first, as
before).

    python bench/late_batch.py
    python bench/late_batch.py --read-all
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bodies import gpu_record  # noqa: E402
from bench.hostile import _heavy_body  # noqa: E402
from server.detect.service import DetectionService  # noqa: E402
from server.detect.settings import DetectionSettings  # noqa: E402
from server.ingest.decode import decode_rows  # noqa: E402
from server.store import migrate  # noqa: E402
from server.store.engine import make_engine  # noqa: E402
from server.store.writer import IngestWriter  # noqa: E402

CLUSTER = "hostile"  # bench/hostile.py's


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--read-all", action="store_true", help="read every entry's rows back, late or not (the code before)")
    args = p.parse_args()
    if args.read_all:
        DetectionService._to_read = lambda self, cluster, entries: entries
    with tempfile.TemporaryDirectory() as tmp:
        engine = make_engine(f"sqlite:///{tmp}/late.db")
        migrate.upgrade(engine)
        writer = IngestWriter(engine)
        writer.start()
        now = time.time()
        try:
            for k in range(30):
                _store(writer, [_live(n, now - 60 + k, k) for n in range(4)])
            service = DetectionService(engine, DetectionSettings())
            service.run_once()
            _store(writer, [gzip.decompress(_heavy_body(0))] + [_live(n, now - 29, 31) for n in range(4)])
        finally:
            writer.stop()
        tracemalloc.start()
        cpu = time.process_time()
        service.run_once()
        cpu = time.process_time() - cpu
        peak = tracemalloc.get_traced_memory()[1]
        late = sum(shard.detector.late_samples for shard in service.shards.values())
        engine.dispose()
    print(f"{'read all' if args.read_all else 'late entries not read'}: the cycle with a 64,000-sample batch two hours late "
          f"took {cpu:.2f} s CPU, peak {peak / 2**20:.1f} MiB traced (Python allocations); {late:,} samples counted late")
    return 0


def _live(node: int, ts: float, step: int) -> bytes:
    rng = random.Random(node)
    gpus = [gpu_record(rng, node, g, step) for g in range(8)]
    return json.dumps({"version": 1, "node": f"live-{node}", "cluster": CLUSTER, "samples": [{"ts": ts, "gpus": gpus}]}).encode()


def _store(writer: IngestWriter, bodies: list[bytes]) -> None:
    now = time.time()
    for raw in bodies:
        writer.submit(lambda raw=raw: decode_rows(raw, gzipped=False, limit=1 << 26, now=now, max_future_skew_s=300)).result(120)


if __name__ == "__main__":
    sys.exit(main())
