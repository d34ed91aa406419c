"""Running the app under uvicorn inside this process (the demo, tests, benchmarks)."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI

# Seconds an idle keep-alive connection stays open. Agents push about every 10 s and keep
# an idle connection 60 s (agent/push.py); with uvicorn's default of 5 s the collector closed
# connections as agents reused them ("Connection reset by peer", a retry, a warning). The
# collector must keep a connection longer than its clients do, so that it never closes first.
KEEP_ALIVE_S = 75


@dataclass
class RunningServer:
    server: uvicorn.Server
    thread: threading.Thread
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self, timeout: float = 15.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)


def start_in_thread(app: FastAPI, *, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning") -> RunningServer:
    """Start uvicorn on a thread and return once it accepts connections. Port 0 picks a free port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=10, timeout_keep_alive=KEEP_ALIVE_S)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("collector failed to start; see the log above")
        if time.monotonic() > deadline:
            raise TimeoutError("collector did not start within 30 s")
        time.sleep(0.02)
    return RunningServer(server, thread, host, sock.getsockname()[1])
