"""Fleet trace generator for the detection evaluation (bench/detection.py).

Seeded, fast (no NVML: protocol-v1 sample dicts directly), node by node on a fixed sampling
grid, with realistic noise and injected faults whose ground truth it returns:

    fleet = Fleet(FleetConfig(nodes=32, interval=1.0, duration=3600, seed=1))
    fleet.truth                       # [Fault(node, gpu, cause, variant, start, end, ...)]
    for node_idx, body in fleet.batches(30): ...   # v1 request bodies, fleet-interleaved
"""

from bench.fleetgen.faults import CAUSES, VARIANTS, Fault, Variant
from bench.fleetgen.fleet import Fleet, FleetConfig

__all__ = ["CAUSES", "VARIANTS", "Fault", "Fleet", "FleetConfig", "Variant"]
