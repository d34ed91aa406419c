"""Fleet trace generator for the detection evaluation (bench/detection.py).

Seeded, fast (no NVML: protocol-v1 sample dicts directly), with realistic noise and injected
faults whose ground truth it returns. It is built to be as unkind as a real cluster, since
detection is judged on fleets it never saw:

- every node samples on its own phase in [t0, t0 + interval), each tick jittered and now and
  then late (timing.py); `FleetConfig(sync=True)` puts every node on one grid instead;
- gauges are the state at the sample's instant; counters (NVLink, InfiniBand, xmit_wait)
  integrate each state's rate over the time since the node's previous sample (phases.py);
- training steps of 1-20 s, checkpoint and evaluation pauses taken by a whole job at once,
  jobs starting, ending and resizing, a node joining mid-run, a job mixing GPU models
  (layout.py, churn.py);
- a GPU reset and an IB counter reset on healthy nodes (counters back to zero), and an agent
  outage whose spool is replayed afterwards (churn.py, timing.py): none of it a fault;
- beside the training jobs, one node in eight serves: inference replicas of 1, 2 or 4 GPUs,
  each with its own load, under a job label or only a partition (serving.py), so GPUs of one
  model and label are busy side by side without doing the same work;
- a quarter of the nodes serve byte counters as their drivers last refreshed them, every
  second or two, each device on its own phase (cached.py): read at 1 s, a port reads 0 now and
  then (or every other sample), then twice its traffic.

    fleet = Fleet(FleetConfig(nodes=32, interval=1.0, duration=3600, seed=1))
    fleet.truth                       # [Fault(node, gpu, cause, variant, start, end, ...)]
    for node_idx, body in fleet.batches(30): ...   # v1 request bodies, in arrival order
    for send_time, node_idx, body in fleet.bodies(30): ...   # the same, with when each is sent
"""

from bench.fleetgen.faults import CAUSES, VARIANTS, Fault, Variant
from bench.fleetgen.fleet import Fleet, FleetConfig

__all__ = ["CAUSES", "VARIANTS", "Fault", "Fleet", "FleetConfig", "Variant"]
