"""laggard-agent: sample this node's GPUs and RDMA ports and push them to the collector.

Every flag has an environment fallback so a DaemonSet can configure the agent from its
pod spec; a flag given on the command line wins.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit

from agent import __version__
from agent.boot import boot_time
from agent.push import DEFAULT_CLUSTER, MemoryQueue, Pusher, SampleQueue
from agent.runner import Runner, collect
from agent.sample import NicSample, build_batch
from agent.spool import MIN_MAX_BYTES as MIN_SPOOL_BYTES
from agent.spool import DiskSpool, SpoolError
from agent.sysfs.infiniband import IbPorts

log = logging.getLogger("agent")

BATCH_SECONDS = 10.0
DEFAULT_SPOOL_DIR = "/var/lib/laggard-agent/spool"
DEFAULT_SPOOL_MAX_BYTES = 256 * 1024 * 1024
_SIZE_UNITS = {"": 1, "K": 1024, "KI": 1024, "M": 1024**2, "MI": 1024**2, "G": 1024**3, "GI": 1024**3}


class UsageError(Exception):
    pass


def parse_labels(items: list[str], origin: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"{origin} {item!r}: expected KEY=VALUE, e.g. rack=r12")
        labels[key] = value.strip()
    return labels


def parse_simulate(spec: str) -> tuple[str, int]:
    """ "H100:8" -> ("H100", 8); "H100" -> ("H100", 8)."""
    model, sep, count = spec.partition(":")
    if not model.strip():
        raise UsageError(f"--simulate {spec!r}: expected MODEL[:N], e.g. H100:8")
    if not sep:
        return model.strip(), 8
    try:
        n = int(count)
    except ValueError:
        n = 0
    if n < 1:
        raise UsageError(f"--simulate {spec!r}: N must be a positive number of GPUs")
    return model.strip(), n


def parse_size(text: str, origin: str) -> int:
    """ "268435456", "256MiB", "256M", "1G", "512k" -> bytes (binary units)."""
    raw = text.strip().upper().removesuffix("B")
    digits = raw.rstrip("KMGI")
    factor = _SIZE_UNITS.get(raw[len(digits):])
    try:
        value = int(digits) if factor is not None else None
    except ValueError:
        value = None
    if value is None:
        raise UsageError(f"{origin} {text!r}: expected a size in bytes, e.g. 268435456 or 256MiB")
    return value * factor


def spool_dir_setting(args: argparse.Namespace, env: dict[str, str], simulate: tuple[str, int] | None) -> str | None:
    """The spool directory, or None for the in-memory queue ('' turns the spool off).

    A simulated agent spools only where told to: its samples are not this node's, and must
    never be sent later by the real agent sharing the default directory."""
    if args.spool_dir is not None:
        return args.spool_dir or None
    if "LAGGARD_SPOOL_DIR" in env:
        return env["LAGGARD_SPOOL_DIR"] or None
    return None if simulate else DEFAULT_SPOOL_DIR


def _env_number(env: dict[str, str], name: str, kind: type, default):
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return kind(raw)
    except ValueError:
        what = "whole number" if kind is int else "number"
        raise UsageError(f"{name}={raw!r} is not a {what}") from None


def build_parser(env: dict[str, str]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="laggard-agent",
        description="Sample GPUs (NVML) and InfiniBand/RoCE ports (sysfs) and push them to a Laggard collector.",
    )
    p.add_argument("--version", action="version", version=f"laggard-agent {__version__}")
    p.add_argument("--collector", metavar="URL", default=env.get("LAGGARD_COLLECTOR_URL", "http://127.0.0.1:8080"),
                   help="collector base URL (env LAGGARD_COLLECTOR_URL; default %(default)s)")
    p.add_argument("--interval", metavar="SECONDS", type=float, default=None,
                   help="seconds between samples (env LAGGARD_INTERVAL; default 5)")
    p.add_argument("--node", default=None, help="node name (env NODE_NAME; default the hostname)")
    p.add_argument("--cluster", default=env.get("LAGGARD_CLUSTER") or None,
                   help="cluster name (env LAGGARD_CLUSTER; default: the cluster the token is bound to, asked of the "
                        f"collector; {DEFAULT_CLUSTER!r} if it names none)")
    p.add_argument("--label", metavar="KEY=VALUE", action="append", default=[],
                   help="node label, repeatable (env LAGGARD_LABELS=k=v,k2=v2; flags win per key)")
    p.add_argument("--sysfs-root", default=env.get("LAGGARD_SYSFS_ROOT", "/sys"),
                   help="where sysfs is mounted (env LAGGARD_SYSFS_ROOT; default %(default)s)")
    p.add_argument("--proc-root", default=env.get("LAGGARD_PROC_ROOT", "/proc"),
                   help="where the host's /proc is seen, to find which workload uses each GPU: the host's "
                        "own with hostPID, else a hostPath mount such as /host/proc "
                        "(env LAGGARD_PROC_ROOT; default %(default)s)")
    p.add_argument("--attribution", choices=["auto", "off"], default=env.get("LAGGARD_ATTRIBUTION", "auto").lower(),
                   help="report the workload (pod, Slurm job, process) on each GPU: auto = from NVML's process "
                        "lists, /proc and, in a pod, this node's pods from the API server; under --simulate the "
                        "simulated GPUs' processes (one Slurm job) from a simulated /proc "
                        "(env LAGGARD_ATTRIBUTION; default %(default)s)")
    p.add_argument("--pods-url", metavar="URL", default=env.get("LAGGARD_PODS_URL") or None,
                   help="any URL answering this node's PodList, instead of the in-cluster API server "
                        "(env LAGGARD_PODS_URL)")
    p.add_argument("--scontrol", metavar="PATH", default=env.get("LAGGARD_SCONTROL") or None,
                   help="scontrol binary to name Slurm jobs whose processes do not carry SLURM_JOB_NAME/USER "
                        "(env LAGGARD_SCONTROL; default: not run)")
    p.add_argument("--batch", metavar="N", type=int, default=None,
                   help="samples per request (env LAGGARD_BATCH; default: about 10 s worth, "
                        "e.g. 2 at --interval 5, 10 at --interval 1)")
    p.add_argument("--max-queue", metavar="N", type=int, default=None,
                   help="samples kept in memory while the collector is unreachable and there is no spool "
                        "(or its disk refuses writes); oldest dropped first (env LAGGARD_MAX_QUEUE; default 720)")
    p.add_argument("--spool-dir", metavar="DIR", default=None,
                   help="keep unsent samples on disk here, across restarts; '' = in memory only "
                        f"(env LAGGARD_SPOOL_DIR; default {DEFAULT_SPOOL_DIR}, none with --simulate)")
    p.add_argument("--spool-max-bytes", metavar="SIZE", default=None,
                   help="cap on the spool's size, oldest samples dropped first (e.g. 1GiB; "
                        "env LAGGARD_SPOOL_MAX_BYTES; default 256MiB)")
    p.add_argument("--token", default=env.get("LAGGARD_TOKEN") or None,
                   help="bearer token with the agent scope for the collector (env LAGGARD_TOKEN)")
    p.add_argument("--token-file", metavar="PATH", default=env.get("LAGGARD_TOKEN_FILE") or None,
                   help="read the token from this file, e.g. a mounted Secret (env LAGGARD_TOKEN_FILE)")
    p.add_argument("--auth-retry", metavar="SECONDS", type=float, default=None,
                   help="after a 401/403 (a token or --cluster/--node to fix), keep the samples and send them again "
                        "this often (env LAGGARD_AUTH_RETRY; default 60)")
    p.add_argument("--ca-bundle", metavar="PATH", default=env.get("LAGGARD_CA_BUNDLE") or None,
                   help="verify an https:// collector against these CA certificates (PEM) instead of the system's "
                        "(env LAGGARD_CA_BUNDLE)")
    p.add_argument("--allow-insecure-http", action="store_true",
                   default=env.get("LAGGARD_ALLOW_INSECURE_HTTP", "").lower() in {"1", "true", "yes"},
                   help="allow a plain http:// collector that is not on this host: the token and the samples travel "
                        "unencrypted (env LAGGARD_ALLOW_INSECURE_HTTP=1; fine behind a service mesh that encrypts)")
    p.add_argument("--once", action="store_true", help="take one sample, print it as a v1 batch, exit; no push")
    p.add_argument("--output", metavar="PATH", default=None,
                   help="with --once: where to write the JSON ('-' = stdout, the default); implies --once")
    p.add_argument("--simulate", metavar="MODEL[:N]", default=env.get("LAGGARD_SIMULATE") or None,
                   help="use a simulated NVML library with N GPUs of MODEL (e.g. H100:8) and a simulated "
                        "IB tree instead of the real ones (env LAGGARD_SIMULATE)")
    p.add_argument("--fault", metavar="SPEC", action="append", default=[],
                   help="with --simulate: inject a fault, repeatable (e.g. gpu3:thermal, ib2:down)")
    p.add_argument("--metrics-port", metavar="[HOST:]PORT", default=env.get("LAGGARD_METRICS_PORT") or None,
                   help="serve this node's latest readings at http://HOST:PORT/metrics, Prometheus text format, "
                        "and GET /healthz (503 once sampling has stalled) "
                        "(env LAGGARD_METRICS_PORT; default off; HOST defaults to 0.0.0.0)")
    p.add_argument("--log-level", default=env.get("LAGGARD_LOG_LEVEL", "INFO"),
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"], type=str.upper,
                   help="(env LAGGARD_LOG_LEVEL; default %(default)s)")
    return p


@dataclass
class Config:
    collector: str
    interval: float
    node: str
    cluster: str | None  # None: the cluster the token is bound to (asked of the collector)
    labels: dict[str, str]
    sysfs_root: str
    batch: int
    max_queue: int
    token: str | None
    once: bool
    output: str
    simulate: tuple[str, int] | None
    faults: list[str] = field(default_factory=list)
    log_level: str = "INFO"
    metrics_port: str | None = None  # [HOST:]PORT of the node's own /metrics (agent/metrics.py)
    spool_dir: str | None = None  # None: unsent samples wait in memory only (agent/spool/)
    spool_max_bytes: int = DEFAULT_SPOOL_MAX_BYTES
    ca_bundle: str | None = None  # PEM CA certificates for an https:// collector; None: the system's
    token_file: str | None = None  # read again before retrying a 401/403: a Secret may be fixed in place
    auth_retry: float = 60.0
    proc_root: str = "/proc"
    attribution: str = "auto"  # "auto" | "off" (under --simulate: the simulated processes and /proc)
    pods_url: str | None = None
    scontrol: str | None = None


def is_loopback_url(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_config(argv: list[str] | None = None, env: dict[str, str] | None = None) -> Config:
    """Flags over environment over defaults; exits with status 2 and a message on bad input."""
    env = dict(os.environ if env is None else env)
    parser = build_parser(env)
    args = parser.parse_args(argv)
    # The checks run in this order, and the first failing one is the message shown.
    try:
        interval, batch = _interval_and_batch(args, env)
        auth_retry, max_queue = _auth_retry_and_max_queue(args, env)
        labels = _labels_setting(args, env)
        _check_collector(args)
        token = _token_setting(args)
        simulate = _simulate_setting(args)
        spool_dir = spool_dir_setting(args, env, simulate)
        spool_max_bytes = _spool_max_bytes_setting(args, env)
        _check_metrics_port(args)
        attribution = _attribution_setting(args)
    except UsageError as exc:
        parser.error(str(exc))
    node = args.node or env.get("NODE_NAME") or socket.gethostname()
    return Config(
        collector=args.collector, interval=interval, node=node, cluster=args.cluster, labels=labels,
        sysfs_root=args.sysfs_root, batch=batch, max_queue=max_queue, token=token, ca_bundle=args.ca_bundle,
        token_file=args.token_file, auth_retry=auth_retry,
        once=args.once or args.output is not None, output=args.output or "-", simulate=simulate,
        faults=list(args.fault), log_level=args.log_level, metrics_port=args.metrics_port,
        spool_dir=spool_dir, spool_max_bytes=spool_max_bytes,
        proc_root=args.proc_root, attribution=attribution, pods_url=args.pods_url, scontrol=args.scontrol,
    )


def _attribution_setting(args: argparse.Namespace) -> str:
    if args.attribution not in {"auto", "off"}:  # from LAGGARD_ATTRIBUTION: argparse checks only the flag
        raise UsageError(f"--attribution {args.attribution!r}: expected auto or off")
    return args.attribution


def _flag_or_env_number(flag, env: dict[str, str], name: str, kind: type, default):
    return flag if flag is not None else _env_number(env, name, kind, default)


def _interval_and_batch(args: argparse.Namespace, env: dict[str, str]) -> tuple[float, int]:
    interval = _flag_or_env_number(args.interval, env, "LAGGARD_INTERVAL", float, 5.0)
    if not interval > 0:
        raise UsageError(f"--interval {interval:g}: must be a positive number of seconds")
    # ~10 s per request whatever the interval: bounded latency, few requests per node.
    default_batch = max(1, round(BATCH_SECONDS / interval))
    batch = _flag_or_env_number(args.batch, env, "LAGGARD_BATCH", int, default_batch)
    if batch < 1:
        raise UsageError(f"--batch {batch}: must be at least 1")
    return interval, batch


def _auth_retry_and_max_queue(args: argparse.Namespace, env: dict[str, str]) -> tuple[float, int]:
    auth_retry = _flag_or_env_number(args.auth_retry, env, "LAGGARD_AUTH_RETRY", float, 60.0)
    if not auth_retry > 0:
        raise UsageError(f"--auth-retry {auth_retry:g}: must be a positive number of seconds")
    max_queue = _flag_or_env_number(args.max_queue, env, "LAGGARD_MAX_QUEUE", int, 720)
    if max_queue < 1:
        raise UsageError(f"--max-queue {max_queue}: must be at least 1")
    return auth_retry, max_queue


def _labels_setting(args: argparse.Namespace, env: dict[str, str]) -> dict[str, str]:
    """LAGGARD_LABELS, then the --label flags over it key by key."""
    env_labels = [s for s in env.get("LAGGARD_LABELS", "").split(",") if s.strip()]
    labels = parse_labels(env_labels, "LAGGARD_LABELS item")
    labels.update(parse_labels(args.label, "--label"))
    return labels


def _check_collector(args: argparse.Namespace) -> None:
    """The collector URL, and the CA bundle to verify it with."""
    if not args.collector.startswith(("http://", "https://")):
        raise UsageError(f"--collector {args.collector!r}: expected an http:// or https:// URL")
    if args.collector.startswith("http://") and not args.allow_insecure_http and not is_loopback_url(args.collector):
        raise UsageError(f"--collector {args.collector}: plain HTTP to another host would send the token and the samples "
                         "unencrypted; use https:// (with --ca-bundle for a private CA) or pass --allow-insecure-http")
    if args.ca_bundle and not os.path.isfile(args.ca_bundle):
        raise UsageError(f"--ca-bundle {args.ca_bundle}: no such file")


def _token_setting(args: argparse.Namespace) -> str | None:
    """The token file's content when there is one, else --token (or LAGGARD_TOKEN)."""
    if not args.token_file:
        return args.token
    try:
        return Path(args.token_file).read_text().strip()
    except OSError as exc:
        raise UsageError(f"--token-file {args.token_file}: {exc.strerror}") from None


def _simulate_setting(args: argparse.Namespace) -> tuple[str, int] | None:
    simulate = parse_simulate(args.simulate) if args.simulate else None
    if args.fault and simulate is None:
        raise UsageError("--fault needs --simulate (faults are injected into the simulator)")
    return simulate


def _spool_max_bytes_setting(args: argparse.Namespace, env: dict[str, str]) -> int:
    spool_max_bytes = DEFAULT_SPOOL_MAX_BYTES
    if args.spool_max_bytes is not None:
        spool_max_bytes = parse_size(args.spool_max_bytes, "--spool-max-bytes")
    elif env.get("LAGGARD_SPOOL_MAX_BYTES"):
        spool_max_bytes = parse_size(env["LAGGARD_SPOOL_MAX_BYTES"], "LAGGARD_SPOOL_MAX_BYTES")
    if spool_max_bytes < MIN_SPOOL_BYTES:
        raise UsageError(f"--spool-max-bytes {spool_max_bytes}: must be at least {MIN_SPOOL_BYTES} (64KiB)")
    return spool_max_bytes


def _check_metrics_port(args: argparse.Namespace) -> None:
    if not args.metrics_port:
        return
    from agent.metrics import parse_listen

    try:
        parse_listen(args.metrics_port)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


# --- sources --------------------------------------------------------------------------


class NvmlUnavailable(Exception):
    pass


def open_attribution(cfg: Config):
    """What uses each GPU (agent/workload/), or None when off."""
    if cfg.attribution == "off":
        return None
    from agent.workload import open_attribution as open_node_attribution

    return open_node_attribution(proc_root=cfg.proc_root, node=cfg.node, pods_url=cfg.pods_url, scontrol=cfg.scontrol)


def open_real_gpus(attribution=None):
    """NvmlGpuSource on the real driver; NvmlUnavailable with advice when there is none."""
    import pynvml

    from agent.nvml.source import NvmlGpuSource

    try:
        return NvmlGpuSource(attribution=attribution)
    except pynvml.NVMLError as err:
        if err.value in (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED):
            raise NvmlUnavailable(
                f"cannot use NVML ({err}): is the NVIDIA driver installed and libnvidia-ml.so.1 "
                "visible to the agent? To try the agent without GPUs, run with --simulate H100:8"
            ) from None
        raise NvmlUnavailable(f"NVML initialisation failed: {err}") from None


@dataclass
class Sources:
    """What a node loop reads from, plus how to release it."""

    gpus: object  # has read(ts) -> list[GpuSample], driver_version(), cuda_version()
    read_nics: Callable[[float], list[NicSample]]
    close: Callable[[], None]
    attribution: object | None = None  # agent.workload's NodeAttribution (counters() for /metrics); None when off


def real_sources(cfg: Config) -> Sources:
    attribution = open_attribution(cfg)
    try:
        gpus = open_real_gpus(attribution)
    except BaseException:
        if attribution is not None:
            attribution.close()
        raise
    ports = IbPorts(cfg.sysfs_root)

    def close() -> None:
        ports.close()
        gpus.close()

    return Sources(gpus, lambda ts: ports.read(), close, attribution=attribution)


SIM_JOB = ("1001", "sim-train")  # the Slurm job (id, name) a simulated agent's GPUs run


def simulated_sources(model: str, count: int, faults: list[str], *, node: str, attribution: str = "auto") -> Sources:
    """A one-node simulated fleet: fake libnvidia-ml under the real pynvml, simulated IB tree;
    its GPUs run one Slurm job (SIM_JOB), attributed through a simulated /proc unless off."""
    from agent.sim.faults import parse_fault_spec
    from agent.sim.fleet import SimFleet
    from agent.sim.infiniband import is_ib_fault

    for spec in faults:
        gpu = None if is_ib_fault(spec) else parse_fault_spec(spec).gpu
        if gpu is not None and gpu >= count:
            raise UsageError(f"--fault {spec!r}: there is no GPU {gpu} (simulating {count}: gpu0..gpu{count - 1})")
    fleet = SimFleet()
    try:
        sim = fleet.add_node(node, model=model, gpus=count, faults=faults, keep_files_open=True, attribution=attribution != "off")
        sim.sim.run_slurm_job(SIM_JOB[0], SIM_JOB[1])
    except BaseException:
        fleet.close()
        raise
    return Sources(sim, sim.read_nics, fleet.close, attribution=sim.attribution)


# --- main -----------------------------------------------------------------------------


def agent_info(gpus) -> dict[str, str | float | None]:
    def ask(name: str) -> str | None:
        try:
            return getattr(gpus, name)()
        except Exception:
            return None

    return {"version": __version__, "driver": ask("driver_version"), "cuda": ask("cuda_version"), "boot_time": boot_time()}


def write_once(cfg: Config, sources: Sources) -> None:
    sample = collect(time.time(), sources.gpus, sources.read_nics)
    body = build_batch([sample], node=cfg.node, cluster=cfg.cluster or DEFAULT_CLUSTER, labels=cfg.labels,
                       agent_info=agent_info(sources.gpus))
    text = json.dumps(body, indent=2) + "\n"
    if cfg.output == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        with open(cfg.output, "w") as f:
            f.write(text)


def healthz_stale_after(interval: float) -> float:
    """/healthz fails after this many seconds without a sample: several missed intervals, and
    never under a minute (one slow NVML read on a busy node is not a hang)."""
    return max(60.0, 6 * interval)


def open_queue(cfg: Config) -> SampleQueue:
    """The spool when there is one and its directory is usable, else the in-memory queue."""
    if cfg.spool_dir:
        try:
            spool = DiskSpool(cfg.spool_dir, max_bytes=cfg.spool_max_bytes, max_memory_samples=cfg.max_queue)
        except (SpoolError, OSError) as exc:
            log.warning("%s; unsent samples wait in memory instead (at most %d, lost on exit)", exc, cfg.max_queue)
        else:
            log.info("spool %s (cap %.0f MiB): %d unsent samples waiting", cfg.spool_dir,
                     cfg.spool_max_bytes / 2**20, len(spool))
            return spool
    return MemoryQueue(cfg.max_queue)


def run_forever(cfg: Config, sources: Sources, stop: threading.Event) -> None:
    queue = open_queue(cfg)
    pusher = Pusher(
        cfg.collector, node=cfg.node, cluster=cfg.cluster, labels=cfg.labels, agent_info=agent_info(sources.gpus),
        token=cfg.token, token_file=cfg.token_file, ca_bundle=cfg.ca_bundle, batch_size=cfg.batch,
        max_delay=max(cfg.batch * cfg.interval, 1.0), queue=queue, auth_retry=cfg.auth_retry,
    )
    sink, metrics_server = pusher, None
    if cfg.metrics_port:  # the node's own /metrics: a tee in front of the pusher (agent/metrics.py)
        from agent.metrics import start_metrics

        sink, metrics_server = start_metrics(cfg.metrics_port, pusher, node=cfg.node, cluster=cfg.cluster or DEFAULT_CLUSTER,
                                             driver=agent_info(sources.gpus)["driver"], pusher=pusher,
                                             attribution=sources.attribution, stale_after=healthz_stale_after(cfg.interval))
        pusher.on_cluster = lambda cluster: setattr(sink, "cluster", cluster)  # once learnt from the token
    pusher.start()
    runner = Runner(sources.gpus, sink, interval=cfg.interval, read_nics=sources.read_nics, stop=stop)
    log.info("laggard-agent %s: node=%s cluster=%s collector=%s interval=%gs batch=%d%s",
             __version__, cfg.node, cfg.cluster or "(the token's)", cfg.collector, cfg.interval, cfg.batch,
             f" simulate={cfg.simulate[0]}:{cfg.simulate[1]}" if cfg.simulate else "")
    try:
        runner.run()
    finally:
        pusher.close()
        if isinstance(queue, DiskSpool):
            queue.close()
        if metrics_server is not None:
            metrics_server.close()
        log.info("stopped: %d samples sent, %d rejected, %d dropped from the queue, %d left %s",
                 pusher.stats.sent_samples, pusher.stats.rejected_samples, pusher.dropped, len(queue),
                 "in the spool for the next start" if isinstance(queue, DiskSpool) else "unsent")


def main(argv: list[str] | None = None) -> int:
    cfg = parse_config(argv)
    logging.basicConfig(level=cfg.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # httpx logs every request at INFO: one line per push is noise in a node's journal.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))
    try:
        sources = (simulated_sources(*cfg.simulate, cfg.faults, node=cfg.node, attribution=cfg.attribution) if cfg.simulate
                   else real_sources(cfg))
    except (NvmlUnavailable, UsageError, ValueError) as exc:
        print(f"laggard-agent: error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, (UsageError, ValueError)) else 1
    try:
        if cfg.once:
            try:
                write_once(cfg, sources)
            except OSError as exc:
                print(f"laggard-agent: error: cannot write {cfg.output}: {exc.strerror}", file=sys.stderr)
                return 1
            return 0
        stop = threading.Event()
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: stop.set())
        run_forever(cfg, sources, stop)
        return 0
    finally:
        sources.close()


if __name__ == "__main__":
    sys.exit(main())
