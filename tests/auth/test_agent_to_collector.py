"""The agent, a real process, pushing to a real `laggard server` with authentication on and
HTTPS: with its token and the collector's CA its samples are stored; without the CA it does
not talk to the collector at all (its samples wait), and with another cluster's token they are
refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from sqlalchemy import func, select

from server.auth.store import create_token
from server.store import migrate, schema
from server.store.engine import make_engine
from tests.auth.test_tls import free_port, wait_https
from tests.auth.tls import certificate  # noqa: F401 (fixture)


def stored(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(schema.GpuSample)).scalar()


def agent(url: str, token_file, tmp_path, name: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "agent.cli", "--simulate", "H100:2", "--interval", "0.5", "--batch", "1",
                             "--collector", url, "--token-file", str(token_file), "--cluster", "prod-a", "--node", name, *extra],
                            env=os.environ | {"LAGGARD_SPOOL_DIR": ""}, stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"{name}.log", "w"))


def test_agent_pushes_over_https_with_its_token(sqlite_url, tmp_path, certificate):  # noqa: F811
    cert, key = certificate
    engine = make_engine(sqlite_url)
    migrate.upgrade(engine)
    with engine.begin() as conn:
        token = create_token(conn, scopes=frozenset({"agent"}), cluster="prod-a")[0]
        other = create_token(conn, scopes=frozenset({"agent"}), cluster="prod-b")[0]
    (tmp_path / "token").write_text(token + "\n")
    (tmp_path / "other").write_text(other + "\n")
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "server.cli", "--log-level", "warning", "server", "--port", str(port),
                               "--database-url", sqlite_url, "--tls-cert", str(cert), "--tls-key", str(key)],
                              env=os.environ | {"LAGGARD_INSECURE": "0", "LAGGARD_DETECTION_ENABLED": "false"},
                              stderr=subprocess.PIPE, text=True)
    url = f"https://127.0.0.1:{port}"
    agents = []
    try:
        wait_https(f"{url}/healthz", str(cert), server)
        agents.append(agent(url, tmp_path / "token", tmp_path, "no-ca"))  # system CAs do not know ours
        agents.append(agent(url, tmp_path / "other", tmp_path, "wrong-cluster", "--ca-bundle", str(cert)))
        agents.append(agent(url, tmp_path / "token", tmp_path, "good", "--ca-bundle", str(cert)))
        deadline = time.monotonic() + 60
        while stored(engine) < 6 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)  # the other two agents have tried a few times by now
        with engine.connect() as conn:
            nodes = set(conn.execute(select(schema.Node.name)).scalars())
        assert nodes == {"good"}
        assert stored(engine) >= 6
    finally:
        for a in agents:
            a.send_signal(signal.SIGTERM)
        for a in agents:
            a.wait(30)
        server.terminate()
        server.wait(30)
        engine.dispose()
    assert "CERTIFICATE_VERIFY_FAILED" in (tmp_path / "no-ca.log").read_text() or "certificate" in (tmp_path / "no-ca.log").read_text()
    assert "403" in (tmp_path / "wrong-cluster.log").read_text()
