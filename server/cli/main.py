"""`laggard`: the collector's command line (server, migrate, demo)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from server import __version__
from server.auth import cli as cli_tokens
from server.cli import errors as cli_errors
from server.cli import stragglers as cli_stragglers
from server.hints import cli as cli_hints
from server.hints import cli_ack
from server.settings import Settings, settings_from_flags


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=getattr(logging, args.log_level.upper()), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # One line per HTTP request from the demo's agents would drown the progress lines.
    for noisy in ("alembic.runtime.plugins", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if args.log_level != "debug":
        # "Running upgrade 0001 -> 0002" on every `laggard token` or `migrate` is noise; --log-level debug shows it.
        logging.getLogger("alembic").setLevel(logging.WARNING)
    try:
        return args.run(args)
    except cli_errors.config_errors() as exc:
        print(f"laggard {args.command}: {cli_errors.explain(exc, args)}", file=sys.stderr)
        return cli_errors.EXIT_CONFIG


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="laggard", description="Laggard collector: GPU straggler detection.")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--version", action="version", version=f"laggard {__version__}")
    # The domains' commands (server/auth/cli.py, server/hints/cli.py) get their settings from
    # here: a domain never imports the collector's settings class above it.
    parser.set_defaults(load_settings=settings_from_flags)
    sub = parser.add_subparsers(dest="command", required=True)

    server = sub.add_parser("server", help="run the collector (FastAPI under uvicorn)")
    _database_flag(server)
    server.add_argument("--host", help="listen address (LAGGARD_HOST, default 127.0.0.1)")
    server.add_argument("--port", type=int, help="listen port (LAGGARD_PORT, default 8080)")
    server.add_argument("--workers", type=int, help="worker processes (LAGGARD_WORKERS, default 1)")
    server.add_argument("--tls-cert", dest="tls_cert_file", help="serve HTTPS with this PEM certificate chain (LAGGARD_TLS_CERT_FILE)")
    server.add_argument("--tls-key", dest="tls_key_file", help="the PEM private key of --tls-cert (LAGGARD_TLS_KEY_FILE)")
    server.add_argument("--insecure", action="store_const", const=True, default=None,
                        help="turn authentication off: anyone may push, read and drain (LAGGARD_AUTH__INSECURE=1; demos and tests only)")
    server.set_defaults(run=_run_server)

    migrate = sub.add_parser("migrate", help="upgrade the database schema to the latest revision")
    _database_flag(migrate)
    migrate.set_defaults(run=_run_migrate)

    demo = sub.add_parser("demo", help="collector on SQLite plus a simulated fleet pushing to it")
    demo.add_argument("--nodes", type=int, default=16)
    demo.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    demo.add_argument("--model", default="H100", help="simulated GPU model")
    demo.add_argument("--interval", type=float, default=5.0, help="agent sampling interval, seconds")
    demo.add_argument("--port", type=int, default=8080)
    demo.add_argument("--host", default="127.0.0.1")
    demo.add_argument("--database-url", default=None, help="default: sqlite file laggard-demo.db in the working directory")
    demo.add_argument("--duration", type=float, default=None, help="stop after this many seconds (default: until Ctrl-C)")
    demo.set_defaults(run=_run_demo)

    cli_stragglers.add_parser(sub)
    cli_hints.add_parser(sub)
    cli_ack.add_parser(sub)
    cli_tokens.add_parser(sub, _database_flag)
    return parser


def _database_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--database-url", help="SQLAlchemy URL (LAGGARD_DATABASE_URL, default sqlite:///laggard.db)")


def _run_server(args: argparse.Namespace) -> int:
    import uvicorn

    from server.app import create_app
    from server.serve import KEEP_ALIVE_S

    settings = settings_from_flags(args)
    if settings.migrate_on_start:
        # Startup would fail on it anyway, as a traceback from inside uvicorn. (Without migrating
        # at start the collector may come up before its database and wait, not ready.)
        cli_errors.check_database(settings.database_url)
    common = {"host": settings.host, "port": settings.port, "log_level": args.log_level, "timeout_graceful_shutdown": 10,
              "timeout_keep_alive": KEEP_ALIVE_S, **_tls(settings)}
    if settings.workers <= 1:
        # uvicorn shuts down gracefully on SIGTERM/SIGINT, then raises the signal again against
        # the handlers it found: no-op ones make that a clean exit 0, as with --workers N.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: None)
        uvicorn.run(create_app(settings), **common)
        return 0
    # Migrate once here rather than racing in every worker; the workers get these settings
    # (pickled into each spawned process), the writer process's address added.
    from server.store import migrate
    from server.store.engine import make_engine

    engine = make_engine(settings.database_url)
    migrate.upgrade(engine)
    engine.dispose()
    writer = _start_writer_process(settings)
    worker_settings = settings.with_changes({"migrate_on_start": False, **(writer.worker_settings if writer is not None else {})})
    try:
        return _supervise_workers(worker_settings, common, writer)
    finally:
        if writer is not None:
            writer.stop()


def _tls(settings: Settings) -> dict[str, str]:
    """uvicorn's TLS options; a certificate without its key (or the reverse) is refused."""
    if bool(settings.tls_cert_file) != bool(settings.tls_key_file):
        raise SystemExit("laggard server: --tls-cert and --tls-key go together")
    if not settings.tls_cert_file:
        return {}
    for path in (settings.tls_cert_file, settings.tls_key_file):
        if not os.path.isfile(path):
            raise SystemExit(f"laggard server: TLS file not found: {path}")
    return {"ssl_certfile": settings.tls_cert_file, "ssl_keyfile": settings.tls_key_file}


def _start_writer_process(settings: Settings):
    """On SQLite one process writes for all workers (server/store/writer_service.py)."""
    if not settings.is_sqlite:
        return None
    from server.store.writer_service import WriterProcess

    writer = WriterProcess(settings.database_url, group_max=settings.writer.group_max_bodies, gpu_move_after_s=settings.ingest.gpu_move_after_s)
    writer.start()
    logging.getLogger("uvicorn.error").info("ingest writer process %s at %s", writer.process.pid, writer.address)
    return writer


def _supervise_workers(settings: Settings, common: dict, writer) -> int:
    import multiprocessing
    import threading

    from uvicorn.config import STARTUP_FAILURE

    # Each worker listens on a socket of its own (SO_REUSEPORT) and the kernel spreads new
    # connections over them. On uvicorn's one shared socket the first worker to wake accepts a
    # whole burst, and keep-alive connections stay where they landed: 16 agents connecting at
    # once often ended up 14-16 on one worker. The loop below is uvicorn's supervisor, cut down.
    sockets = _WorkerSockets(settings.host, settings.port)

    def start_worker() -> multiprocessing.Process:
        sock = sockets.next()
        worker = multiprocessing.get_context("spawn").Process(target=_serve_worker, args=(settings, common, [sock]), name="laggard-worker")
        worker.start()
        sockets.handed(sock)  # the worker has its own copy
        return worker

    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    workers = [start_worker() for _ in range(settings.workers)]
    failed = False
    while not stopping.wait(0.5):
        if writer is not None and not writer.alive():
            logging.getLogger("uvicorn.error").warning("ingest writer process died; starting another")
            writer.start()
            logging.getLogger("uvicorn.error").info("ingest writer process %s at %s", writer.process.pid, writer.address)
        for i, worker in enumerate(workers):
            if worker.is_alive():
                continue
            if worker.exitcode == STARTUP_FAILURE:  # it would fail the same way on every restart
                failed = True
                stopping.set()
                break
            logging.getLogger("uvicorn.error").warning("worker %s died (exit code %s); starting another", worker.pid, worker.exitcode)
            workers[i] = start_worker()
    for worker in workers:
        if worker.is_alive():
            worker.terminate()  # SIGTERM: uvicorn's graceful shutdown
    for worker in workers:
        worker.join()
    sockets.close()
    return 1 if failed else 0


class _WorkerSockets:
    """The listening socket for each worker: a socket of its own where the kernel spreads
    connections over sockets on one port (SO_REUSEPORT), else one socket they all share."""

    def __init__(self, host: str, port: int):
        import socket

        self.host, self.port = host, port
        self.reuse_port = hasattr(socket, "SO_REUSEPORT")
        self._shared = None

    def next(self):
        if not self.reuse_port:
            self._shared = self._shared or self._bind()
            return self._shared
        return self._bind()

    def handed(self, sock) -> None:
        if self.reuse_port:
            sock.close()

    def close(self) -> None:
        if self._shared is not None:
            self._shared.close()

    def _bind(self):
        import socket

        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if self.reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]  # --port 0: the others join the first one's port
        return sock


def _serve_worker(settings: Settings, common: dict, sockets: list) -> None:
    """A worker process: the app built from the settings it was handed (no environment to
    read them back from), served on the socket the supervisor bound for it."""
    import uvicorn
    from uvicorn.config import STARTUP_FAILURE

    from server.app import create_app

    try:
        app = create_app(settings)
    except Exception:
        logging.getLogger("uvicorn.error").exception("worker could not build the app")
        sys.exit(STARTUP_FAILURE)
    uvicorn.Server(uvicorn.Config(app, **common)).run(sockets=sockets)


def _run_migrate(args: argparse.Namespace) -> int:
    from server.store import migrate
    from server.store.engine import make_engine

    settings = settings_from_flags(args)
    engine = make_engine(settings.database_url)
    migrate.upgrade(engine)
    print(f"schema at revision {migrate.current_revision(engine)} ({_redact(settings.database_url)})")
    return 0


def _run_demo(args: argparse.Namespace) -> int:
    from server.demo import run_demo

    return run_demo(args)


def _redact(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)

