"""`laggard-agent --metrics-port`: this node's own latest readings in the Prometheus text format,
for sites that scrape nodes rather than (or as well as) the collector, and /healthz. The series
are named by agent/dcgm_fields.py and written by agent/exposition.py."""

from __future__ import annotations

import dataclasses
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from agent import __version__
from agent.dcgm_fields import DCGM_LABELS, XID_FIELD, dcgm_families, dcgm_labels, nic_families
from agent.exposition import CONTENT_TYPE, Family, Renderer

log = logging.getLogger(__name__)




class NodeMetrics:
    """A sample sink that remembers the latest sample and hands every sample on (to the pusher).

    stale_after: /healthz fails once no sample has been taken for this long (an NVML call that
    hangs on a broken GPU stops the sampling loop without ending the process); None: never."""

    def __init__(self, sink, *, node: str, cluster: str, driver: str | None = None, stats: Callable[[], Mapping[str, float]] | None = None,
                 attribution_errors: Callable[[], Mapping[str, int]] | None = None,
                 stale_after: float | None = None, clock: Callable[[], float] = time.monotonic):
        """attribution_errors: the workload attribution's failure counters (reason → count,
        agent/workload/node.py's `counters()`); None when attribution is off: no family then."""
        self.sink = sink
        self.node, self.cluster, self.driver = node, cluster, driver
        self.stats = stats
        self.attribution_errors = attribution_errors
        self.latest = None
        self.samples = 0
        self.stale_after, self._clock = stale_after, clock
        self._last_taken = clock()  # the start counts as a sample: the first one may take a while
        self._xids: dict[str, int] = {}  # uuid → last XID seen
        self._xid_counts: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()
        self._renderer = Renderer()

    def submit(self, sample) -> None:
        with self._lock:
            self.latest = sample
            self.samples += 1
            self._last_taken = self._clock()
            for gpu in sample.gpus:
                for event in gpu.xids:
                    self._xids[gpu.uuid] = event.xid
                    key = (gpu.uuid, event.xid)
                    self._xid_counts[key] = self._xid_counts.get(key, 0) + 1
        if self.sink is not None:
            self.sink.submit(sample)

    def families(self) -> list[Family]:
        with self._lock:
            sample, xids, xid_counts, taken = self.latest, dict(self._xids), dict(self._xid_counts), self.samples
        families: list[Family] = []
        labels_by_uuid: dict[str, tuple[str, ...]] = {}
        gpus = []
        if sample is not None:
            for gpu in sample.gpus:
                labels = dcgm_labels(index=gpu.index, uuid=gpu.uuid, model=gpu.model, hostname=self.node, cluster=self.cluster,
                                     pci_bus_id=gpu.pci_bus_id, driver=self.driver)
                labels_by_uuid[gpu.uuid] = labels
                readings = {} if gpu.lost else dataclasses.asdict(gpu)
                gpus.append((labels, readings))
        families += dcgm_families(gpus)
        xid = Family(XID_FIELD.name, XID_FIELD.type, XID_FIELD.help, DCGM_LABELS)
        for uuid, last in sorted(xids.items()):
            if uuid in labels_by_uuid:
                xid.add(labels_by_uuid[uuid], last)
        families.append(xid)
        gpu_labels = ("cluster", "node", "gpu", "uuid")
        xid_total = Family("laggard_gpu_xid_errors_total", "counter", "XID events seen by this agent since it started.",
                           (*gpu_labels, "xid"))
        index_of = {g.uuid: g.index for g in sample.gpus} if sample is not None else {}
        for (uuid, code), n in sorted(xid_counts.items()):
            xid_total.add((self.cluster, self.node, str(index_of.get(uuid, "")), uuid, str(code)), n)
        families.append(xid_total)
        lost = Family("laggard_gpu_lost", "gauge", "1 when NVML reports the GPU lost or unreachable.", gpu_labels)
        for gpu in sample.gpus if sample is not None else ():
            lost.add((self.cluster, self.node, str(gpu.index), gpu.uuid), int(gpu.lost))
        families.append(lost)
        families += self._nic_families(sample)
        families += self._agent_families(sample, taken)
        return families

    def _nic_families(self, sample) -> list[Family]:
        return nic_families(((self.cluster, self.node, nic.device, str(nic.port)), dataclasses.asdict(nic))
                            for nic in (sample.nics if sample is not None else ()))

    def _agent_families(self, sample, taken: int) -> list[Family]:
        info = Family("laggard_agent_info", "gauge", "The agent's version and the NVIDIA driver's.", ("cluster", "node", "version", "driver"))
        info.add((self.cluster, self.node, __version__, self.driver or ""), 1)
        ts = Family("laggard_agent_last_sample_timestamp_seconds", "gauge", "Time of the latest sample (Unix seconds).", ("cluster", "node"))
        if sample is not None:
            ts.add((self.cluster, self.node), sample.ts)
        sampled = Family("laggard_agent_samples_total", "counter", "Samples taken since the agent started.", ("cluster", "node"))
        sampled.add((self.cluster, self.node), taken)
        out = [info, ts, sampled]
        stats = dict(self.stats()) if self.stats is not None else {}
        for key, name, text in (
            ("sent_samples", "laggard_agent_sent_samples_total", "Samples the collector acknowledged."),
            ("rejected_samples", "laggard_agent_rejected_samples_total", "Samples the collector rejected for good (dropped)."),
            ("failed_attempts", "laggard_agent_push_failures_total", "Push attempts that failed and will be retried."),
            ("refused_attempts", "laggard_agent_push_refusals_total",
             "Push attempts the collector refused with 401/403 (the token, --cluster or --node needs fixing); also failures."),
            ("dropped", "laggard_agent_dropped_samples_total", "Samples dropped from the full queue while the collector was away."),
            ("spool_corrupt", "laggard_agent_spool_corrupt_records_total", "Damaged spool records skipped (torn by a crash, or unreadable)."),
            ("spool_write_errors", "laggard_agent_spool_write_errors_total", "Spool writes the disk refused (samples then wait in memory)."),
        ):
            if key in stats:
                fam = Family(name, "counter", text, ("cluster", "node"))
                fam.add((self.cluster, self.node), stats[key])
                out.append(fam)
        if "queued" in stats:
            fam = Family("laggard_agent_queued_samples", "gauge", "Samples waiting to be pushed.", ("cluster", "node"))
            fam.add((self.cluster, self.node), stats["queued"])
            out.append(fam)
        if "spool_bytes" in stats:
            fam = Family("laggard_agent_spool_bytes", "gauge", "Size of the on-disk spool's files.", ("cluster", "node"))
            fam.add((self.cluster, self.node), stats["spool_bytes"])
            out.append(fam)
        out += self._attribution_families()
        return out

    def _attribution_families(self) -> list[Family]:
        if self.attribution_errors is None:
            return []
        try:  # read from the sampling thread's counters: a scrape must not fail for them
            counters = dict(self.attribution_errors())
        except Exception:
            log.debug("attribution counters unreadable", exc_info=True)
            return []
        fam = Family("laggard_agent_attribution_errors_total", "counter",
                     "Workload attribution failures by reason (docs/attribution.md); the GPU's workload is left unknown.",
                     ("cluster", "node", "reason"))
        for reason, n in sorted(counters.items()):
            fam.add((self.cluster, self.node, reason), n)
        return [fam]

    def exposition(self) -> str:
        return self._renderer.render(self.families())

    def health(self) -> tuple[bool, dict[str, Any]]:
        """(healthy, details) for GET /healthz: healthy while samples keep coming."""
        with self._lock:
            age, taken = self._clock() - self._last_taken, self.samples
        healthy = self.stale_after is None or age <= self.stale_after
        return healthy, {"status": "ok" if healthy else "stale", "samples": taken,
                         "seconds_since_last_sample": round(age, 3), "stale_after_s": self.stale_after}


def pusher_stats(pusher) -> Callable[[], dict[str, float]]:
    def read() -> dict[str, float]:
        s = pusher.stats
        stats = {"sent_samples": s.sent_samples, "rejected_samples": s.rejected_samples, "failed_attempts": s.failed_attempts,
                 "refused_attempts": s.refused_attempts, "dropped": pusher.dropped, "queued": len(pusher.queue)}
        spool = pusher.queue
        if spool.durable:  # agent/spool/'s DiskSpool
            stats.update(spool_bytes=spool.size_bytes, spool_corrupt=spool.corrupt, spool_write_errors=spool.write_errors)
        return stats
    return read


def parse_listen(spec: str) -> tuple[str, int]:
    """"9400" → ("0.0.0.0", 9400); "127.0.0.1:9400" → ("127.0.0.1", 9400); "[::1]:9400" too."""
    host, sep, port = spec.rpartition(":")
    if not sep:
        host, port = "0.0.0.0", spec
    host = host.strip("[]") or "0.0.0.0"
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"--metrics-port {spec!r}: expected PORT or HOST:PORT") from None
    if not 0 <= number <= 65535:
        raise ValueError(f"--metrics-port {spec!r}: port out of range")
    return host, number


class _Server6(ThreadingHTTPServer):
    address_family = socket.AF_INET6


class MetricsServer:
    """GET /metrics and GET /healthz (200 while sampling, 503 once stale: the DaemonSet's
    liveness and readiness probes) on a daemon thread; anything else: 404."""

    def __init__(self, metrics: NodeMetrics, host: str, port: int):
        exposition, health = metrics.exposition, metrics.health

        class Handler(BaseHTTPRequestHandler):
            server_version = f"laggard-agent/{__version__}"

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._reply(200, CONTENT_TYPE, exposition().encode())
                elif path == "/healthz":
                    healthy, details = health()
                    self._reply(200 if healthy else 503, "application/json", json.dumps(details).encode())
                else:
                    self.send_error(404)

            def _reply(self, status: int, content_type: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:  # one line per scrape would flood the journal
                pass

        server_class = _Server6 if ":" in host else ThreadingHTTPServer
        self.httpd = server_class((host, port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="metrics", daemon=True)

    def start(self) -> "MetricsServer":
        self._thread.start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def start_metrics(spec: str, sink, *, node: str, cluster: str, driver: str | None, pusher=None,
                  attribution=None, stale_after: float | None = None) -> tuple[NodeMetrics, MetricsServer]:
    """The sink to hand the Runner, and the server (close() it on exit). attribution: the
    agent's NodeAttribution (anything with counters()), or None when off."""
    host, port = parse_listen(spec)
    metrics = NodeMetrics(sink, node=node, cluster=cluster, driver=driver, stats=pusher_stats(pusher) if pusher is not None else None,
                          attribution_errors=attribution.counters if attribution is not None else None,
                          stale_after=stale_after)
    server = MetricsServer(metrics, host, port).start()
    log.info("metrics at http://%s:%d/metrics", host, server.port)
    return metrics, server
