"""A generated fleet judged in-process: the detector engine fed the fleet's bodies as the
detection service would feed it after reading them back from storage, without HTTP or a
database. For tuning and for the arrival-order tests (tests/detect/test_arrival_orders.py);
the published figures come from bench/detection.py, through the real API.

    python bench/judge.py --interval 5 --seeds 1,2,3          # precision, recall, time to detect
    python bench/judge.py --interval 1 --fault-free           # flags on the fault-free fleets
    python bench/judge.py --orders                            # the four arrival orders agree?
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.fleetgen import Fleet, FleetConfig  # noqa: E402
from server.detect.engine import Detector, EpisodeChange, NodeInstant  # noqa: E402
from server.detect.persistence import Escalated, Opened, Resolved  # noqa: E402
from server.detect.settings import DetectionSettings  # noqa: E402
from server.protocol import GPU_METRICS, NIC_METRICS  # noqa: E402

XID_KEEP_S = 300.0  # what the service's loader attaches around an instant (server/detect/source.py)
BLOCK_S = 600.0


class Instants:
    """Bodies → NodeInstants with the rows the store would give back (every metric present,
    None when not sent; XIDs of the node's GPUs from the last few minutes)."""

    def __init__(self) -> None:
        self.xids: dict[str, dict[str, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))

    def of(self, body: dict) -> list[NodeInstant]:
        cluster, node, labels = body.get("cluster", "default"), body["node"], dict(body.get("labels") or {})
        xids = self.xids[f"{cluster}/{node}"]
        out = []
        for sample in body["samples"]:
            ts = sample["ts"]
            base = {"cluster": cluster, "node": node, "ts": ts}
            gpu_rows = []
            for g in sample.get("gpus", ()):
                row = base | {"uuid": g["uuid"], "index": g["index"], "model": g.get("model")}
                row |= {m: g.get(m) for m in GPU_METRICS}
                row["lost"] = bool(g.get("lost", False))
                gpu_rows.append(row)
                xids[g["uuid"]].extend((x["xid"], x["ts"]) for x in g.get("xids", ()))
            nic_rows = [base | {"device": n["device"], "port": n["port"]} | {m: n.get(m) for m in NIC_METRICS}
                        for n in sample.get("nics", ())]
            recent = {u: [(x, at) for x, at in events if at > ts - XID_KEEP_S] for u, events in xids.items()}
            out.append(NodeInstant(cluster, node, labels, ts, sorted(gpu_rows, key=lambda r: r["index"]), nic_rows, recent))
        return out


def judge(bodies: Iterable[dict], cfg: DetectionSettings | None = None, *, screen: bool = True) -> list[dict]:
    """Feed bodies in the given order, judging after each; the episodes as the API serves them."""
    detector = Detector(cfg or DetectionSettings(), screen=screen)
    instants = Instants()
    episodes = Episodes()
    for body in bodies:
        for item in instants.of(body):
            detector.add(item)
        episodes.apply(detector.advance())
    return episodes.all()


class Episodes:
    """EpisodeChanges → episode records (what GET /api/v1/stragglers/history returns)."""

    def __init__(self) -> None:
        self.open: dict[tuple[str, str], dict] = {}
        self.done: list[dict] = []

    def apply(self, changes: list[EpisodeChange]) -> None:
        for c in changes:
            key = (c.entity, c.cause)
            if isinstance(c.change, Opened):
                f = c.change.finding
                self.open[key] = {"id": len(self.done) + len(self.open), "entity": c.entity, "cause": c.cause, "cluster": c.cluster,
                                  "node": c.node, "gpu": c.gpu, "uuid": c.uuid, "severity": f.severity, "onset": c.change.onset,
                                  "detected_at": c.change.detected_at, "resolved_at": None, "summary": f.summary,
                                  "evidence": f.evidence}
            elif isinstance(c.change, Escalated) and key in self.open:
                self.open[key]["severity"] = c.change.finding.severity
            elif isinstance(c.change, Resolved) and key in self.open:
                ep = self.open.pop(key)
                ep["resolved_at"] = c.change.resolved_at
                self.done.append(ep)

    def all(self) -> list[dict]:
        return sorted(self.done + list(self.open.values()), key=lambda e: (e["detected_at"], e["entity"], e["cause"]))


def identity(ep: dict) -> tuple:
    """What must not depend on arrival order: entity, cause, onset, resolution (ids aside)."""
    return ep["entity"], ep["cause"], ep["onset"], ep["detected_at"], ep["resolved_at"], ep["severity"]


# --- arrival orders (#13 item 3) ----------------------------------------------------------------


def samples_of(fleet: Fleet, batch: int) -> list[dict]:
    return [body for _, body in fleet.batches(batch)]


def single_samples(bodies: list[dict]) -> list[dict]:
    """Every sample its own body."""
    return [body | {"samples": [s]} for body in bodies for s in body["samples"]]


def instant_by_instant(bodies: list[dict]) -> list[dict]:
    """(a) one sample at a time, in sample-time order across the fleet."""
    return sorted(single_samples(bodies), key=lambda b: (b["samples"][0]["ts"], b["node"]))


def node_by_node(bodies: list[dict], block_s: float = BLOCK_S) -> list[dict]:
    """(b) within each ten-minute block of sample time, every sample of one node, then the next."""
    singles = single_samples(bodies)
    t0 = min(b["samples"][0]["ts"] for b in singles)
    return sorted(singles, key=lambda b: (int((b["samples"][0]["ts"] - t0) // block_s), b["node"], b["samples"][0]["ts"]))


def one_node_held_back(bodies: list[dict], node: str, hold_s: float = BLOCK_S) -> list[dict]:
    """(c) one node's samples held back ten minutes, then replayed, oldest first."""
    singles = instant_by_instant(bodies)
    return sorted(singles, key=lambda b: (b["samples"][0]["ts"] + (hold_s if b["node"] == node else 0.0), b["node"] != node))


def random_batches(bodies: list[dict], seed: int, late_s: float = 300.0) -> list[dict]:
    """(d) random batch sizes, every node up to five minutes late (each node's own samples
    stay in its order, as one agent sends them)."""
    rng = random.Random(seed)
    by_node: dict[str, list[dict]] = defaultdict(list)
    for body in single_samples(bodies):
        by_node[body["node"]].append(body)
    sends = []
    for node, singles in by_node.items():
        singles.sort(key=lambda b: b["samples"][0]["ts"])
        k = 0
        while k < len(singles):
            n = rng.randint(1, 40)
            chunk = singles[k:k + n]
            k += n
            merged = chunk[0] | {"samples": [s for b in chunk for s in b["samples"]]}
            sends.append((chunk[-1]["samples"][0]["ts"] + rng.uniform(0.0, late_s), node, merged))
    # One agent never overtakes itself: a node's batch goes no earlier than its previous one.
    last: dict[str, float] = {}
    ordered = []
    for at, node, body in sorted(sends, key=lambda s: s[2]["samples"][0]["ts"]):
        at = max(at, last.get(node, at))
        last[node] = at
        ordered.append((at, node, body))
    return [body for _, _, body in sorted(ordered, key=lambda s: (s[0], s[1]))]


def orders(bodies: list[dict], seed: int) -> Iterator[tuple[str, list[dict]]]:
    nodes = sorted({b["node"] for b in bodies})
    yield "instant by instant", instant_by_instant(bodies)
    yield "node by node in 10-min blocks", node_by_node(bodies)
    yield f"{nodes[len(nodes) // 2]} held back 10 min", one_node_held_back(bodies, nodes[len(nodes) // 2])
    yield "random batches, up to 5 min late", random_batches(bodies, seed)


# --- command line -----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    from bench.detection import node_times, score, ttd_target  # the HTTP harness's scorer

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=24)
    p.add_argument("--interval", type=float, default=5.0)
    p.add_argument("--duration", type=float, default=3600.0)
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--fault-free", action="store_true")
    p.add_argument("--orders", action="store_true", help="judge each fleet in the four arrival orders and compare")
    p.add_argument("--sync", action="store_true", help="synchronised sampling (the old fleets)")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--show", type=int, default=8)
    p.add_argument("--by-cause", action="store_true")
    p.add_argument("--t0", type=float, help="the fleets' start (bench/detection.py starts them at the minute before now: its --json "
                                            "config has it), to judge a run's fleet again in process")
    args = p.parse_args(argv)
    rc = 0
    for seed in (int(s) for s in args.seeds.split(",")):
        cfg = FleetConfig(nodes=args.nodes, interval=args.interval, duration=args.duration, seed=seed, faults=not args.fault_free,
                          gpus_per_node=args.gpus_per_node,
                          **({"sync": True} if args.sync else {}), **({"t0": args.t0} if args.t0 is not None else {}))
        fleet = Fleet(cfg)
        bodies = samples_of(fleet, max(1, int(30 / args.interval)))
        if args.orders:
            results = {name: [identity(e) for e in judge(order)] for name, order in orders(bodies, seed)}
            reference = next(iter(results.values()))
            for name, got in results.items():
                same = got == reference
                rc |= 0 if same else 1
                print(f"seed {seed} {name}: {len(got)} episodes, {'identical' if same else 'DIFFERENT'}")
            continue
        eps = judge(bodies)
        sc = score(fleet.truth, eps, interval=args.interval, grace=120.0, times=node_times(fleet))
        o = sc["overall"]
        print(f"seed {seed} interval {args.interval:g}s: faults {o['faults']} detected {o['detected']} episodes {o['episodes']} "
              f"FP {o['false_positives']} precision {o['precision']} recall {o['recall']} ttd median {o['ttd_median']} p95 {o['ttd_p95']} "
              f"(targets {ttd_target('ttd_median', args.interval):g} / {ttd_target('ttd_p95', args.interval):g} samples)")
        if args.by_cause:
            for cause, t in sc["causes"].items():
                print(f"   {cause:12} faults {t['faults']:3} P {t['precision']} R {t['recall']} ttd {t['ttd_median']} / {t['ttd_p95']}")
        for fp in sc["false_positives"][: args.show]:
            print(f"   FP {fp.get('cause')} {fp.get('node')} gpu {fp.get('gpu')}: {fp.get('summary')}")
        for m in sc["missed"][: args.show]:
            print(f"   MISS {m['cause']}/{m['variant']} {m['node']} gpu {m['gpu']} {m['nic']} start {m['start'] - cfg.t0:.0f}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
