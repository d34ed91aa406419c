"""Detection evaluation harness (docs/detection.md).

Generates fleets (bench/fleetgen: tens of nodes x 8 GPUs, an hour of sample time, realistic
noise, injected faults of every cause with their ground truth), pushes them through the real
HTTP API of a collector, waits until its detector has judged every instant, fetches the
straggler episodes (GET /api/v1/stragglers/history) and scores them against the ground truth:
precision, recall and time-to-detect per cause. The same samples go through bench/baseline.py
(a plain fixed-threshold detector) for the comparison column, and a fault-free copy of each
fleet (same seed, same noise, nothing injected) measures false flags.

By default every node samples on its own phase with jitter and pushes when its batch fills
(one agent spooling through an outage); --sync puts every node on one grid and pushes round
by round, as the fleets of old did.

    python bench/detection.py                                  # defaults: 32 nodes, 1 s and 5 s, 1 h
    python bench/detection.py --interval 5 --nodes 16 --duration 1800
    python bench/detection.py --fault-free                     # only the fault-free fleets
    python bench/detection.py --sync                           # the old, kind fleets: one sampling grid, lockstep pushes
    python bench/detection.py --json out.json --write-docs     # keep everything; refresh the docs table
    python bench/detection.py --url http://127.0.0.1:8080      # a running collector instead of our own
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import math
import os
import queue
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.baseline import BaselineSettings, FixedThresholdDetector  # noqa: E402
from bench.fleetgen import CAUSES, VARIANTS, Fault, Fleet, FleetConfig  # noqa: E402
from bench.fleetgen.serving import serving_count  # noqa: E402

try:
    import orjson

    def _dumps(obj) -> bytes:
        return orjson.dumps(obj)
except ImportError:  # pragma: no cover - orjson ships with the server extra
    def _dumps(obj) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "detection.md"
DOCS_BEGIN, DOCS_END = "<!-- results:begin -->", "<!-- results:end -->"
# Issue #13: precision and recall >= 0.99; time to detect, in samples of the entity, median <=
# max(2 samples, 10 s) and p95 <= max(4 samples, 20 s).
TARGETS = {"precision": 0.99, "recall": 0.99, "ttd_median": (2, 10.0), "ttd_p95": (4, 20.0)}


def ttd_target(name: str, interval: float) -> float:
    samples, seconds = TARGETS[name]
    return max(samples, seconds / interval)


# --- scoring ---------------------------------------------------------------------------------


def ttd_samples(start: float, detected_at: float, interval: float, times: list[float] | None = None) -> int:
    """Samples of the entity from the fault's start to detection, the first faulty sample
    counting as 1 (detected on the first faulty sample: 1; on the next: 2).

    `times`, the node's sample times, makes the count exact: with per-node phases and jitter
    the next sample may come a little less than an interval later."""
    if times is not None:
        return max(1, bisect_right(times, detected_at + 1e-6) - bisect_left(times, start - 1e-6))
    return int(math.floor((detected_at - start) / interval + 1e-6)) + 1


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100.0 * len(ordered)) - 1)]


@dataclass
class Tally:
    faults: int = 0
    detected: int = 0
    episodes: int = 0
    correct: int = 0  # episodes that match a fault (duplicates included)
    duplicates: int = 0  # further episodes of a fault already matched (a flapping detector)
    ttd: list[int] = field(default_factory=list)

    @property
    def false_positives(self) -> int:
        return self.episodes - self.correct

    @property
    def precision(self) -> float | None:
        return self.correct / self.episodes if self.episodes else None

    @property
    def recall(self) -> float | None:
        return self.detected / self.faults if self.faults else None

    def to_json(self) -> dict:
        return {
            "faults": self.faults, "detected": self.detected, "episodes": self.episodes, "correct": self.correct,
            "false_positives": self.false_positives, "duplicates": self.duplicates,
            "precision": self.precision, "recall": self.recall,
            "ttd_median": statistics.median(self.ttd) if self.ttd else None, "ttd_p95": percentile(self.ttd, 95),
            "ttd": self.ttd,
        }


def score(truth: list[Fault], episodes: list[dict], *, interval: float, grace: float,
          times: dict[str, list[float]] | None = None) -> dict:
    """Match episodes to injected faults and tally per cause (`times`: each node's sample
    times, for exact times-to-detect).

    An episode matches a fault of the same cluster, node, GPU (None for network: node-level;
    when the episode's evidence names a port it must be the faulty one) and cause when its
    onset or its detected_at lies in [start, end + grace]. A fault is
    detected when at least one episode matches it; its time-to-detect is that of the earliest
    match. An episode matching nothing is a false positive, listed with its summary and, when
    it overlaps a fault of the same entity with another cause, that fault (a wrong cause).
    """
    by_key: dict[tuple, list[Fault]] = {}
    for f in truth:
        by_key.setdefault((f.cluster, f.node, f.gpu, f.cause), []).append(f)
    tallies = {c: Tally() for c in CAUSES}
    overall = Tally()
    variants: dict[str, Tally] = {}
    for f in truth:
        for t in (tallies.setdefault(f.cause, Tally()), overall, variants.setdefault(f"{f.cause}/{f.variant}", Tally())):
            t.faults += 1
    first_detect: dict[str, float] = {}
    matched_count: dict[str, int] = {}
    false_positives = []
    for ep in sorted(episodes, key=lambda e: (e["detected_at"], str(e.get("id")))):
        cause = ep["cause"]
        t = tallies.setdefault(cause, Tally())
        t.episodes += 1
        overall.episodes += 1
        gpu = ep.get("gpu")
        match = _matching_fault(ep, by_key.get((ep["cluster"], ep["node"], gpu, cause), ()), grace)
        if match is None:
            false_positives.append(_fp_record(ep, truth, grace))
            continue
        t.correct += 1
        overall.correct += 1
        matched_count[match.id] = matched_count.get(match.id, 0) + 1
        if match.id in first_detect:
            t.duplicates += 1
            overall.duplicates += 1
            continue
        first_detect[match.id] = ep["detected_at"]
    for f in truth:
        if f.id in first_detect:
            n = ttd_samples(f.start, first_detect[f.id], interval, times.get(f.node) if times else None)
            for t in (tallies[f.cause], overall, variants[f"{f.cause}/{f.variant}"]):
                t.detected += 1
                t.ttd.append(n)
    missed = [f.to_json() for f in truth if f.id not in first_detect]
    return {
        "causes": {c: t.to_json() for c, t in tallies.items()},
        "overall": overall.to_json(),
        "variants": {k: v.to_json() for k, v in sorted(variants.items())},
        "false_positives": false_positives,
        "missed": missed,
        # Faults reported as several episodes (the condition cleared and came back): correct
        # flags, but alert noise.
        "split": [{"id": f.id, "fault": f"{f.cause}/{f.variant}", "node": f.node, "episodes": matched_count[f.id]}
                  for f in truth if matched_count.get(f.id, 0) > 1],
    }


def _matching_fault(ep: dict, candidates, grace: float) -> Fault | None:
    """The first of `candidates` (faults of the episode's cluster, node, GPU and cause) whose
    [start, end + grace] holds the episode's onset or detected_at; None when none does."""
    eps = 1e-6
    for f in candidates:
        if f.nic is not None and _device(ep) not in (None, f.nic):
            continue  # the episode names another port of the node
        lo, hi = f.start - eps, f.end + grace + eps
        if lo <= ep["onset"] <= hi or lo <= ep["detected_at"] <= hi:
            return f
    return None


def _device(ep: dict) -> str | None:
    evidence = ep.get("evidence") or {}
    device = evidence.get("device") if isinstance(evidence, dict) else None
    return device if isinstance(device, str) else None


def _fp_record(ep: dict, truth: list[Fault], grace: float) -> dict:
    overlapping = [f for f in truth if f.cluster == ep["cluster"] and f.node == ep["node"] and f.start - grace <= ep["detected_at"] <= f.end + grace]
    same_entity = [f for f in overlapping if f.gpu == ep.get("gpu")]
    near = same_entity or overlapping
    return {
        "id": ep.get("id"), "node": ep["node"], "gpu": ep.get("gpu"), "cause": ep["cause"], "onset": ep["onset"],
        "detected_at": ep["detected_at"], "resolved_at": ep.get("resolved_at"), "summary": ep.get("summary", ""),
        "near_fault": f"{near[0].id} {near[0].cause}/{near[0].variant} gpu={near[0].gpu}" if near else None,
    }


# --- the collector -------------------------------------------------------------------------


class Collector:
    """Our own `laggard server` on a fresh SQLite file, or a running one (--url)."""

    def __init__(self, url: str | None, workdir: Path):
        self.proc = None
        self.db_path: Path | None = None
        self.log_path = workdir / "collector.log"
        if url:
            self.url = url.rstrip("/")
            return
        self.db_path = workdir / "laggard.db"
        port = _free_port()
        # Our own collector on loopback, fed by this process alone: no tokens to manage.
        env = os.environ | {"LAGGARD_DATABASE_URL": f"sqlite:///{self.db_path}", "LAGGARD_PORT": str(port),
                            "LAGGARD_HOST": "127.0.0.1", "LAGGARD_WORKERS": "1", "LAGGARD_INSECURE": "true"}
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "server.cli", "--log-level", "warning", "server"], env=env,
                                     cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"collector exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if http_get(self.url, "/readyz")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise SystemExit("collector did not become ready within 60 s")

    @property
    def host_port(self) -> tuple[str, int]:
        u = urllib.parse.urlsplit(self.url)
        return u.hostname or "127.0.0.1", u.port or 80

    def alive(self) -> bool:
        return self.proc is None or self.proc.poll() is None

    def cpu_seconds(self) -> float | None:
        if self.proc is None:
            return None
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            return None

    def judged_until(self) -> dict[str, float] | None:
        """How far the detector has judged each cluster (sample time), read from our own
        database; None when that is not readable (a --url collector, an older schema)."""
        if self.db_path is None or not self.db_path.exists():
            return None
        try:
            with sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True, timeout=5) as conn:
                rows = conn.execute("SELECT key, value FROM detector_progress WHERE key LIKE 'judged_until:%'").fetchall()
        except sqlite3.Error:
            return None
        return {k.split(":", 1)[1]: v for k, v in rows}

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            self._log.close()


def http_get(url: str, path: str, params: dict | None = None, timeout: float = 60) -> tuple[int, bytes]:
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)
    try:
        conn.request("GET", path + ("?" + urllib.parse.urlencode(params) if params else ""))
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def fetch_episodes(url: str, cluster: str, since: float, until: float) -> list[dict] | None:
    """The detector's episodes of one cluster overlapping [since, until]; None when the
    collector has no stragglers endpoint."""
    status, body = http_get(url, "/api/v1/stragglers/history", {"since": since, "until": until, "cluster": cluster})
    if status == 404:
        return None
    if status != 200:
        raise RuntimeError(f"history: {status} {body[:300]!r}")
    return json.loads(body)["stragglers"]


# --- pushing -------------------------------------------------------------------------------


@dataclass
class PushStats:
    requests: int = 0
    gpu_samples: int = 0
    seconds: float = 0.0
    retries: int = 0
    rounds_done: int = 0
    rounds: int = 0
    error: str | None = None


def push_fleet(fleet: Fleet, collector: Collector, *, batch: int, clients: int, baselines: list[FixedThresholdDetector],
               stats: PushStats | None = None) -> PushStats:
    """Push the fleet's bodies in the order its agents send them (Fleet.batches: by send
    time; round by round for a --sync fleet), one node count of bodies at a time, each round
    only after the previous one was committed, from `clients` keep-alive connections, while
    the next round is being generated; feed every sample to the baselines on the way.

    Sample time advances together across the fleet, as it does in a real one: no node a whole
    batch ahead of the others, except the agent replaying its spool after an outage."""
    host, port = collector.host_port
    work: queue.Queue = queue.Queue()
    errors: list[str] = []
    stats = stats or PushStats()
    lock = threading.Lock()
    threads = [threading.Thread(target=_push_client, args=(host, port, work, errors, stats, lock), daemon=True)
               for _ in range(clients)]
    for t in threads:
        t.start()
    n_nodes = len(fleet.sims)
    stats.rounds = math.ceil(fleet.cfg.steps / batch)
    start = time.perf_counter()
    pending: list[bytes] = []
    for _idx, body in fleet.batches(batch):
        _feed_baselines(body, baselines, stats)
        pending.append(_dumps(body))
        if len(pending) == n_nodes:
            work.join()  # the previous round is committed
            if errors:
                break
            if not collector.alive():
                errors.append("collector died:\n" + collector.log_tail())
                break
            stats.rounds_done += 1 if stats.requests else 0
            _enqueue(work, pending, stats)
            pending = []
    work.join()
    if pending and not errors:  # a node that joined late leaves the last round short
        _enqueue(work, pending, stats)
        work.join()
    if not errors:
        stats.rounds_done = stats.rounds
    _stop_clients(work, threads)
    stats.seconds = time.perf_counter() - start
    if errors:
        stats.error = f"{len(errors)} requests failed, first: {errors[0]}"
    return stats


_PUSH_HEADERS = {"Content-Type": "application/json", "Content-Encoding": "gzip"}


def _push_client(host: str, port: int, work: queue.Queue, errors: list[str], stats: PushStats, lock: threading.Lock) -> None:
    """One keep-alive connection posting the bodies of `work` until it gets None."""
    conn = http.client.HTTPConnection(host, port, timeout=300)
    while True:
        item = work.get()
        if item is None:
            work.task_done()
            break
        conn = _post_samples(conn, host, port, gzip.compress(item, compresslevel=1), errors, stats, lock)
        work.task_done()
    conn.close()


def _post_samples(conn: http.client.HTTPConnection, host: str, port: int, body: bytes, errors: list[str], stats: PushStats,
                  lock: threading.Lock) -> http.client.HTTPConnection:
    """POST one gzipped body, retrying on 429/503 and connection errors with backoff; a failure
    goes to `errors`. Returns the connection to go on with (a new one after a connection error)."""
    payload = b""
    for attempt in range(8):
        try:
            conn.request("POST", "/api/v1/samples", body=body, headers=_PUSH_HEADERS)
            resp = conn.getresponse()
            payload = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            conn = http.client.HTTPConnection(host, port, timeout=300)
            status, payload = None, str(exc).encode()
        else:
            status = resp.status
        if status == 200:
            break
        if status is not None and status not in (429, 503):
            errors.append(f"{status} {payload[:300]!r}")
            break
        with lock:
            stats.retries += 1
        time.sleep(min(5.0, 0.2 * 2 ** attempt))
    else:
        errors.append(f"gave up after retries: {payload[:300]!r}")
    return conn


def _feed_baselines(body: dict, baselines: list[FixedThresholdDetector], stats: PushStats) -> None:
    for sample in body["samples"]:
        for b in baselines:
            b.feed(body["cluster"], body["node"], sample)
        stats.gpu_samples += len(sample["gpus"])


def _enqueue(work: queue.Queue, pending: list[bytes], stats: PushStats) -> None:
    for item in pending:
        work.put(item)
    stats.requests += len(pending)


def _stop_clients(work: queue.Queue, threads: list[threading.Thread]) -> None:
    for _ in threads:
        work.put(None)
    for t in threads:
        t.join()


def detection_behind(collector: Collector, clusters: dict[str, float]) -> dict[str, float] | None:
    """Seconds of sample time each cluster's detector still has to judge (only clusters still
    behind); None when progress is not readable (a --url collector)."""
    judged = collector.judged_until()
    if judged is None:
        return None
    return {c: last - judged.get(c, float("-inf")) for c, last in clusters.items() if judged.get(c, float("-inf")) < last}


def wait_for_detection(targets: list[tuple[Collector, dict[str, float]]], *, since: float, until: float, timeout: float,
                       settle: float) -> tuple[bool, str]:
    """Until every detector has judged its clusters' last instant (read from our own
    databases), then until the episode lists stop changing for `settle` seconds. A detector
    that makes no progress for 5 minutes while its process sits idle is declared stuck."""
    deadline = time.monotonic() + timeout
    failure = _wait_until_judged(targets, deadline)
    if failure is not None:
        return False, failure
    return _wait_until_settled(targets, since=since, until=until, deadline=deadline, timeout=timeout, settle=settle)


def _wait_until_judged(targets: list[tuple[Collector, dict[str, float]]], deadline: float) -> str | None:
    """Until every detector has judged its clusters' last instant or `deadline` passes; the
    reason when a collector died or a detector is stuck, else None."""
    last_print = time.monotonic()
    seen: dict[int, tuple] = {}
    while time.monotonic() < deadline:
        behind_all = {}
        for i, (collector, clusters) in enumerate(targets):
            if not collector.alive():
                return "collector died:\n" + collector.log_tail()
            behind = detection_behind(collector, clusters)
            if not behind:
                continue
            behind_all.update(behind)
            cpu = collector.cpu_seconds() or 0.0
            prev = seen.get(i)
            if prev is None or prev[0] != behind:
                seen[i] = (behind, time.monotonic(), cpu)
            elif time.monotonic() - prev[1] > 300 and cpu - prev[2] < 5.0:
                return f"detector stuck: no progress for 300 s with its process idle; behind by {behind}"
        if not behind_all:
            break
        if time.monotonic() - last_print > 15:
            print("    detector still to judge: " + ", ".join(f"{c} {s:.0f} s" for c, s in behind_all.items()), flush=True)
            last_print = time.monotonic()
        time.sleep(1.0)
    return None


def _wait_until_settled(targets: list[tuple[Collector, dict[str, float]]], *, since: float, until: float, deadline: float,
                        timeout: float, settle: float) -> tuple[bool, str]:
    """Until the episode lists stop changing for `settle` seconds, or `deadline` passes."""
    previous, stable_since = None, time.monotonic()
    while time.monotonic() < deadline:
        snapshot = []
        for collector, clusters in targets:
            for cluster in clusters:
                eps = fetch_episodes(collector.url, cluster, since, until)
                if eps is None:
                    return False, "no stragglers endpoint"
                snapshot.append(sorted((e["id"], e["detected_at"], e.get("resolved_at"), e["severity"]) for e in eps))
        if snapshot != previous:
            previous, stable_since = snapshot, time.monotonic()
        elif time.monotonic() - stable_since >= settle:
            return True, ""
        time.sleep(1.0)
    return False, f"detection not finished after {timeout:.0f} s"


# --- reporting -----------------------------------------------------------------------------


def _f(x, digits: int = 3) -> str:
    if x is None:
        return "–"
    if isinstance(x, float) and not x.is_integer():
        return f"{x:.{digits}f}"
    return f"{x:g}" if isinstance(x, float) else str(x)


def results_table(run: dict, *, markdown: bool) -> str:
    """One row per cause plus overall: Laggard's scores next to the baseline's."""
    det, base = run.get("detector"), run["baseline"]
    head = ["cause", "faults", "Laggard P", "R", "TTD p50", "p95", "FP", "baseline P", "R", "TTD p50", "p95", "FP"]
    rows = []
    for cause in [*CAUSES, "overall"] if "truth" in run else []:
        b = base["overall"] if cause == "overall" else base["causes"][cause]
        d = (det["overall"] if cause == "overall" else det["causes"][cause]) if det else None
        name = f"**{cause}**" if markdown and cause == "overall" else cause
        rows.append([
            name, str(b["faults"]),
            *([_f(d["precision"]), _f(d["recall"]), _f(d["ttd_median"], 1), _f(d["ttd_p95"]), str(d["false_positives"])] if d else ["n/a"] * 5),
            _f(b["precision"]), _f(b["recall"]), _f(b["ttd_median"], 1), _f(b["ttd_p95"]), str(b["false_positives"]),
        ])
    clean = run.get("clean")
    if clean:
        d_flags = "n/a" if clean.get("detector_flags") is None else str(clean["detector_flags"])
        rows.append([("fault-free fleet: flags" if not markdown else "*fault-free fleet: flags*"), "0",
                     "", "", "", "", d_flags, "", "", "", "", str(clean["baseline_flags"])])
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    out = ["  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(head, widths)))]
    out += ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    return "\n".join(out)


def verdict(run: dict) -> str:
    det = run.get("detector")
    checks = []
    if det:
        o = det["overall"]
        checks += [
            ("precision", o["precision"] is not None and o["precision"] >= TARGETS["precision"], _f(o["precision"])),
            ("recall", o["recall"] is not None and o["recall"] >= TARGETS["recall"], _f(o["recall"])),
            ("TTD p50", o["ttd_median"] is not None and o["ttd_median"] <= ttd_target("ttd_median", run["interval"]),
             _f(o["ttd_median"], 1)),
            ("TTD p95", o["ttd_p95"] is not None and o["ttd_p95"] <= ttd_target("ttd_p95", run["interval"]), _f(o["ttd_p95"])),
        ]
    clean = run.get("clean")
    if clean and clean.get("detector_flags") is not None:
        checks.append(("fault-free flags", clean["detector_flags"] == 0, str(clean["detector_flags"])))
    if not checks:
        return "no detector scores"
    return ", ".join(f"{name} {value} {'ok' if ok else 'MISSED'}" for name, ok, value in checks)


def print_details(label: str, sc: dict, limit: int) -> None:
    if sc["missed"]:
        print(f"  {label}: missed {len(sc['missed'])} fault(s):")
        for f in sc["missed"][:limit]:
            print(f"    {f['id']} {f['node']} gpu={f['gpu']} nic={f['nic']} {f['cause']}/{f['variant']} at +{f['start'] - T0[0]:.0f} s")
    if sc["false_positives"]:
        print(f"  {label}: {len(sc['false_positives'])} false positive(s):")
        for fp in sc["false_positives"][:limit]:
            near = f" [near {fp['near_fault']}]" if fp["near_fault"] else ""
            print(f"    {fp['node']} gpu={fp['gpu']} {fp['cause']} at +{fp['detected_at'] - T0[0]:.0f} s: {fp['summary'][:140]}{near}")
        if len(sc["false_positives"]) > limit:
            print(f"    ... {len(sc['false_positives']) - limit} more (see --json)")


T0 = [0.0]  # the run's t0, for relative times in printed details


def variant_lines(run: dict) -> list[str]:
    det, base = run.get("detector"), run["baseline"]
    out = []
    for key, b in base["variants"].items():
        d = det["variants"].get(key) if det else None
        dtxt = f"{d['detected']}/{d['faults']} (TTD p50 {_f(d['ttd_median'], 1)})" if d else "n/a"
        out.append(f"| {key} | {dtxt} | {b['detected']}/{b['faults']} |")
    return out


VARIANTS_BEGIN, VARIANTS_END = "<!-- variants:begin -->", "<!-- variants:end -->"


def variants_markdown() -> str:
    """The fault catalogue (bench/fleetgen/faults.py VARIANTS) as the docs' table."""
    lines = ["| cause | variant | subtle | what the samples show |", "|---|---|:-:|---|"]
    lines += [f"| {v.cause} | {v.name} |{' ✓ ' if v.subtle else '  '}| {v.what} |" for v in VARIANTS]
    return "\n".join(lines)


def _replace_block(text: str, begin: str, end: str, block: str) -> str:
    if begin not in text or end not in text:
        return text.rstrip() + f"\n\n{begin}\n{block}{end}\n"
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{block}{end}{tail}"


def write_docs(payload: dict) -> None:
    cfg = payload["config"]
    command = re.sub(r"\s--(json|docs-from)(\s+|=)\S+|\s--write-docs", "", payload["command"])
    commit = f", commit {payload['commit']}" if payload.get("commit") else ""
    gpus = cfg.get("gpus_per_node", 8)
    parts = [f"Run: `{command}` — {cfg['nodes']} training nodes + {serving_count(cfg['nodes'])} serving nodes x {gpus} GPUs, "
             f"{cfg['duration']:.0f} s of sample time, "
             f"seed {cfg['seed']}, {payload['machine']}{commit}; wall time {payload['wall_s']:.0f} s.", ""]
    for run in payload["runs"]:
        parts.append(f"### {run['interval']:g} s sampling ({run['fleet_summary']})")
        parts.append("")
        parts.append(results_table(run, markdown=True))
        parts.append("")
        parts.append(f"Targets: {verdict(run)}.")
        if run.get("detector_note"):
            parts.append(f"Detector: {run['detector_note']}.")
        strict = run.get("baseline_with_power_cap")
        if strict:
            o = strict["overall"]
            parts.append(f"Baseline counting the routine SW power cap bit as well: {o['episodes']:,} episodes, "
                         f"precision {_f(o['precision'])}, recall {_f(o['recall'])}.")
        clean = run.get("clean")
        if clean:
            by = ", ".join(f"{c} {n}" for c, n in sorted(clean["baseline_by_cause"].items(), key=lambda kv: -kv[1]))
            parts.append(f"Baseline flags on the fault-free fleet by cause: {by or 'none'}.")
        det = run.get("detector")

        def where(node: str, gpu, nic=None) -> str:
            return f"{node} gpu {gpu}" if gpu is not None else f"{node} {nic}" if nic else node

        listed = [("Laggard missed", [f"{m['id']} {m['cause']}/{m['variant']} on {where(m['node'], m['gpu'], m['nic'])}"
                                      for m in det["missed"]] if det else []),
                  ("Laggard false positives", [f"{where(fp['node'], fp['gpu'])} {fp['cause']}: {fp['summary'][:120]}"
                                               + (f" (near {fp['near_fault']})" if fp.get("near_fault") else "")
                                               for fp in det["false_positives"]] if det else []),
                  ("Laggard flags on the fault-free fleet", [f"{where(fp['node'], fp['gpu'])} {fp['cause']}: {fp['summary'][:120]}"
                                                             for fp in (clean or {}).get("detector_fp") or []])]
        if det and det.get("split"):
            listed.append(("Laggard split faults into several episodes",
                           [f"{x['id']} {x['fault']} on {x['node']}: {x['episodes']} episodes" for x in det["split"]]))
        for title, items in listed:
            if items:
                parts.append(f"{title} ({len(items)}):")
                parts.append("")
                parts += [f"- {item}" for item in items[:10]] + ([f"- ... {len(items) - 10} more"] if len(items) > 10 else [])
                parts.append("")
        parts.append("")
        parts.append("<details><summary>Per variant: faults detected (Laggard, baseline)</summary>")
        parts.append("")
        parts.append("| cause/variant | Laggard | baseline |")
        parts.append("|---|---:|---:|")
        parts += variant_lines(run)
        parts.append("")
        parts.append("</details>")
        parts.append("")
    block = "\n".join(parts).rstrip() + "\n"
    text = DOCS.read_text() if DOCS.exists() else "# Detection\n"
    text = _replace_block(text, VARIANTS_BEGIN, VARIANTS_END, variants_markdown() + "\n")
    DOCS.write_text(_replace_block(text, DOCS_BEGIN, DOCS_END, block))


# --- main ----------------------------------------------------------------------------------


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=24)
    p.add_argument("--interval", default="1,5", help="sampling interval(s) in seconds, comma-separated (default 1,5)")
    p.add_argument("--duration", type=float, default=3600.0, help="seconds of sample time per fleet")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--sync", action="store_true",
                   help="synchronised sampling (the old fleets): every node on one grid, pushed round by round")
    p.add_argument("--faults-per-cause", type=int, default=6)
    p.add_argument("--gpus-per-node", type=int, default=8,
                   help="GPUs per node (1-8; fewer than min_peers: GPUs judged only against other nodes)")
    p.add_argument("--fault-free", action="store_true", help="run only the fault-free fleets and report their flags")
    p.add_argument("--no-clean", action="store_true", help="skip the fault-free fleets")
    p.add_argument("--batch-seconds", type=float, default=30.0,
                   help="sample time per request (30 samples at 1 s, 6 at 5 s)")
    p.add_argument("--clients", type=int, default=4, help="concurrent pushing connections")
    p.add_argument("--grace", type=float, default=120.0, help="seconds after a fault's end an episode still matches it")
    p.add_argument("--url", help="a running collector (default: start our own on a temporary SQLite file)")
    p.add_argument("--wait", type=float, default=1800.0, help="longest wait for the detector to catch up, seconds")
    p.add_argument("--settle", type=float, default=5.0, help="episode lists unchanged this long = detection done")
    p.add_argument("--json", metavar="PATH", help="write config, ground truth, episodes and scores here")
    p.add_argument("--write-docs", action="store_true", help=f"replace the results section of {DOCS.relative_to(ROOT)}")
    p.add_argument("--show", type=int, default=12, help="false positives / misses to print per fleet")
    p.add_argument("--docs-from", metavar="PATH", help="only rewrite the docs' results from the --json of an earlier run")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.docs_from:
        write_docs(_rescore(json.loads(Path(args.docs_from).read_text())))
        print(f"wrote {DOCS.relative_to(ROOT)} from {args.docs_from}")
        return 0
    intervals = [float(x) for x in str(args.interval).split(",") if x.strip()]
    wall0 = time.perf_counter()

    t0 = float((int(time.time()) - int(args.duration) - 180) // 60 * 60)
    T0[0] = t0
    fleets = _make_fleets(args, intervals, t0)
    example = fleets[0][1] or fleets[0][2]
    print(f"fleet (seed {args.seed}): {args.nodes} training nodes + {serving_count(args.nodes)} serving nodes x {args.gpus_per_node} GPUs, "
          f"{args.duration:.0f} s of sample time, "
          f"intervals {', '.join(f'{i:g} s' for i in intervals)}")
    print(example.describe())
    if fleets[0][1] is not None:
        print(f"  {len(fleets[0][1].truth)} injected faults per faulty fleet ({args.faults_per_cause} per cause; a node-wide power brake counts 8)")

    with tempfile.TemporaryDirectory(prefix="laggard-detection-") as tmp:
        runs = _run_all(args, fleets, t0, Path(tmp))
    wall = time.perf_counter() - wall0

    for run in runs:
        print_run(run, args.show, t0)
    print(f"\nwall time {wall:.0f} s")

    payload = {
        "command": "python bench/detection.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": f"{os.cpu_count()} CPUs",
        "commit": _commit(),
        "wall_s": wall,
        "config": {"nodes": args.nodes, "intervals": intervals, "duration": args.duration, "seed": args.seed, "t0": t0,
                   "faults_per_cause": args.faults_per_cause, "grace": args.grace, "batch_seconds": args.batch_seconds,
                   "clients": args.clients, "sync": args.sync,
                   "gpus_per_node": args.gpus_per_node},
        "runs": runs,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(payload, indent=1, default=str))
        print(f"wrote {args.json}")
    if args.write_docs:
        write_docs(payload)
        print(f"wrote {DOCS.relative_to(ROOT)}")
    return 0


def _make_fleets(args: argparse.Namespace, intervals: list[float], t0: float) -> list[tuple[float, Fleet | None, Fleet | None]]:
    """(interval, faulty fleet, fault-free fleet) per interval, either None where the options skip it."""
    tag = "" if not args.url else f"-{int(t0)}"
    fleets: list[tuple[float, Fleet | None, Fleet | None]] = []
    for iv in intervals:
        def cfg(faults: bool, suffix: str) -> FleetConfig:
            return FleetConfig(nodes=args.nodes, interval=iv, duration=args.duration, seed=args.seed, t0=t0,
                               cluster=f"eval-{iv:g}s{suffix}{tag}", faults=faults, faults_per_cause=args.faults_per_cause,
                               sync=args.sync, gpus_per_node=args.gpus_per_node)
        faulty = None if args.fault_free else Fleet(cfg(True, ""))
        clean = None if args.no_clean and not args.fault_free else Fleet(cfg(False, "-clean"))
        fleets.append((iv, faulty, clean))
    return fleets


def print_run(run: dict, show: int, t0: float) -> None:
    print()
    print(f"== {run['interval']:g} s sampling: {run['fleet_summary']}")
    print(results_table(run, markdown=False))
    print(f"targets: {verdict(run)}")
    if run.get("detector_note"):
        print(f"detector: {run['detector_note']}")
    if run.get("detector"):
        print_details("Laggard", run["detector"], show)
    if run.get("clean") and run["clean"].get("detector_fp"):
        print(f"  Laggard on the fault-free fleet: {run['clean']['detector_flags']} flag(s):")
        for fp in run["clean"]["detector_fp"][:show]:
            print(f"    {fp['node']} gpu={fp['gpu']} {fp['cause']} at +{fp['detected_at'] - t0:.0f} s: {fp['summary'][:140]}")
    if run.get("push"):
        print(f"  push: {run['push']}")


@dataclass
class _Job:
    interval: float
    fleet: Fleet
    faulty: bool
    collector: Collector | None = None
    stats: PushStats = field(default_factory=PushStats)
    baseline: FixedThresholdDetector = field(default_factory=FixedThresholdDetector)
    strict: FixedThresholdDetector = field(default_factory=lambda: FixedThresholdDetector(BaselineSettings(count_power_cap=True)))
    cpu0: float | None = None


def _run_all(args, fleets, t0: float, workdir: Path) -> list[dict]:
    """Each fleet into its own collector (own SQLite file, own detector process), all at
    once: the collectors are single-process and detection-bound, so this uses the cores a
    sequential run would leave idle. With --url every fleet goes to that collector."""
    jobs = [_Job(iv, fleet, fleet is faulty) for iv, faulty, clean in fleets for fleet in (faulty, clean) if fleet is not None]
    try:
        for job in jobs:
            sub = workdir / job.fleet.cfg.cluster
            sub.mkdir()
            job.collector = Collector(args.url, sub)
            job.cpu0 = job.collector.cpu_seconds()
        _push_all(args, jobs)
        note, episodes, cpu = _detect_all(args, jobs, t0)
    finally:
        for job in jobs:
            if job.collector is not None:
                job.collector.stop()
    return [_score_run(args, iv, faulty, clean, jobs, note, episodes, cpu) for iv, faulty, clean in fleets]


def _push_job(args, job: _Job) -> None:
    batch = max(1, round(args.batch_seconds / job.interval))
    try:
        push_fleet(job.fleet, job.collector, batch=batch, clients=args.clients, baselines=[job.baseline, job.strict],
                   stats=job.stats)
    except Exception as exc:  # noqa: BLE001 - reported below
        job.stats.error = f"{type(exc).__name__}: {exc}"


def _push_all(args, jobs: list[_Job]) -> None:
    """Every job's fleet pushed at once, one thread each, with progress every 15 s; exits on a
    failed push."""
    for job in jobs:
        batch = max(1, round(args.batch_seconds / job.interval))
        print(f"  pushing {job.fleet.cfg.cluster}: {job.fleet.cfg.steps} samples x {len(job.fleet.sims)} nodes, "
              f"{batch} samples per request", flush=True)
    threads = [threading.Thread(target=_push_job, args=(args, job), daemon=True) for job in jobs]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        for t in threads:
            t.join(15.0 / len(threads))
        if any(t.is_alive() for t in threads):
            print("    pushed " + ", ".join(f"{j.fleet.cfg.cluster} {j.stats.rounds_done}/{j.stats.rounds}" for j in jobs), flush=True)
    for job in jobs:
        if job.stats.error:
            raise SystemExit(f"pushing {job.fleet.cfg.cluster}: {job.stats.error}")
        cpu = job.collector.cpu_seconds()
        st = job.stats
        cpu_txt = f", collector {cpu - job.cpu0:.0f} CPU-s so far" if cpu is not None and job.cpu0 is not None else ""
        print(f"    {job.fleet.cfg.cluster}: {st.gpu_samples:,} GPU-samples in {st.requests} requests, {st.seconds:.0f} s "
              f"({st.gpu_samples / st.seconds:,.0f}/s{cpu_txt})", flush=True)


def _detect_all(args, jobs: list[_Job], t0: float) -> tuple[str, dict[int, list[dict] | None], dict[int, float | None]]:
    """Wait for the detector(s), then fetch each job's episodes: (the wait's note, episodes and
    collector CPU-seconds by id of the job)."""
    since, until = t0 - 1.0, max(j.fleet.t_end for j in jobs) + 3600.0
    print("  waiting for the detector(s) ...", flush=True)
    w0 = time.perf_counter()
    # Each node is judged up to its own last sample: wait for the earliest of those.
    targets = [(j.collector, {j.fleet.cfg.cluster: min(t[-1] for t in j.fleet.times)}) for j in jobs]
    ok, note = wait_for_detection(targets, since=since, until=until, timeout=args.wait, settle=args.settle)
    print(f"    {'done' if ok else 'stopped'} after {time.perf_counter() - w0:.0f} s{': ' + note if note else ''}", flush=True)
    episodes = {id(j): fetch_episodes(j.collector.url, j.fleet.cfg.cluster, since, until) for j in jobs}
    cpu = {id(j): (j.collector.cpu_seconds() or 0.0) - (j.cpu0 or 0.0) if j.cpu0 is not None else None for j in jobs}
    return note, episodes, cpu


def _score_run(args, iv: float, faulty: Fleet | None, clean: Fleet | None, jobs: list[_Job], note: str,
               episodes: dict[int, list[dict] | None], cpu: dict[int, float | None]) -> dict:
    """One interval's entry of the results: the faulty fleet scored, the fault-free one's flags."""
    main_fleet = faulty or clean
    entry: dict = {"interval": iv, "fleet_summary": f"{len(main_fleet.sims)} nodes, {main_fleet.cfg.steps} samples each, "
                                                     f"{len(faulty.truth) if faulty else 0} injected faults"}
    if note:
        entry["detector_note"] = note
    for job in (j for j in jobs if j.interval == iv):
        det_eps = episodes[id(job)]
        if det_eps is None:
            entry["detector_note"] = "no stragglers endpoint on this collector: Laggard columns empty"
        base_eps, strict_eps = job.baseline.finish(), job.strict.finish()
        push_txt = (f"{job.stats.gpu_samples:,} GPU-samples in {job.stats.seconds:.0f} s"
                    + (f", collector {cpu[id(job)]:.0f} CPU-s" if cpu[id(job)] is not None else ""))
        if job.faulty:
            _score_faulty(args, entry, iv, job.fleet, det_eps, base_eps, strict_eps)
            entry["push"] = push_txt
        else:
            entry["clean"] = _clean_flags(det_eps, base_eps, strict_eps, push_txt)
    if faulty is None:  # --fault-free: only the flags row
        entry["baseline"] = score([], [], interval=iv, grace=args.grace)
        entry["detector"] = None
    return entry


def _score_faulty(args, entry: dict, iv: float, fleet: Fleet, det_eps: list[dict] | None, base_eps: list[dict],
                  strict_eps: list[dict]) -> None:
    times = node_times(fleet)
    sc_s = score(fleet.truth, strict_eps, interval=iv, grace=args.grace, times=times)
    entry["baseline"] = score(fleet.truth, base_eps, interval=iv, grace=args.grace, times=times)
    entry["baseline_with_power_cap"] = {"overall": sc_s["overall"]}
    entry["detector"] = None if det_eps is None else score(fleet.truth, det_eps, interval=iv, grace=args.grace, times=times)
    entry["truth"] = [f.to_json() for f in fleet.truth]
    entry["episodes"] = {"detector": det_eps, "baseline": base_eps}


def _clean_flags(det_eps: list[dict] | None, base_eps: list[dict], strict_eps: list[dict], push_txt: str) -> dict:
    return {
        "detector_flags": None if det_eps is None else len(det_eps),
        "detector_fp": None if det_eps is None else [_fp_record(e, [], 0) for e in det_eps],
        "baseline_flags": len(base_eps),
        "baseline_with_power_cap_flags": len(strict_eps),
        "baseline_by_cause": _by_cause(base_eps),
        "detector_by_cause": None if det_eps is None else _by_cause(det_eps),
        "push": push_txt,
    }


def node_times(fleet: Fleet) -> dict[str, list[float]]:
    return {spec.name: fleet.times[spec.idx] for spec in fleet.layout.nodes}


def _rescore(payload: dict) -> dict:
    """Score a saved run again with this scorer (its ground truth and episodes are kept; the
    nodes' sample times are drawn again from the saved config, which is cheap)."""
    cfg = payload["config"]
    grace = cfg["grace"]
    for run in payload["runs"]:
        if "truth" not in run:
            continue
        truth = [Fault(**f) for f in run["truth"]]
        times = node_times(Fleet(FleetConfig(nodes=cfg["nodes"], interval=run["interval"], duration=cfg["duration"],
                                             seed=cfg["seed"], t0=cfg["t0"], faults_per_cause=cfg["faults_per_cause"],
                                             sync=cfg.get("sync", True), gpus_per_node=cfg.get("gpus_per_node", 8))))
        for key in ("detector", "baseline"):
            eps = run["episodes"].get(key)
            if eps is not None:
                run[key] = score(truth, eps, interval=run["interval"], grace=grace, times=times)
    return payload


def _commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + (" + local changes" if dirty.stdout.strip() else "")


def _by_cause(eps: list[dict]) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in eps:
        out[e["cause"]] = out.get(e["cause"], 0) + 1
    return out


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    sys.exit(main())
