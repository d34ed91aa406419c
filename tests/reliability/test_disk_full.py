"""The database's disk fills up under a running collector (a real small filesystem: tmpfs,
holding the SQLite file or a PostgreSQL tablespace): pushes are answered 507 "disk full",
never 200, /readyz turns 503 while writes fail, nothing acknowledged is lost, and once space
is freed the refused batches are stored and readiness returns, without a restart. Before,
the answer was 503 "database unavailable: OperationalError" and /readyz stayed 200."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.reliability.collector import CollectorProcess, sample_keys, stored_gpu_samples
from tests.server.payloads import batch, encode

# Enough pushes to use up what the database still has allocated once the filesystem is full.
MAX_PUSHES_UNTIL_FULL = 400
RECOVERY_S = 60


def _refuse(reason: str):
    # Under CI a test that cannot build its filesystem fails, never silently skips.
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


@contextlib.contextmanager
def small_filesystem(size_mb: int):
    # Not under pytest's tmp_path, whose parents the PostgreSQL server's user cannot enter.
    path = Path(tempfile.mkdtemp(prefix="laggard-small-disk-"))
    path.chmod(0o755)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0755", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        path.rmdir()
        _refuse(f"cannot mount a small tmpfs (needs root): {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
        path.rmdir()


def fill(disk: Path) -> Path:
    """Take every free byte of the filesystem; remove the returned file to free them."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        chunk = b"\xff" * 65536
        while True:
            try:
                os.write(fd, chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                if len(chunk) == 1:
                    return filler
                chunk = chunk[: len(chunk) // 2]
    finally:
        os.close(fd)


@pytest.fixture
def sqlite_on_small_disk():
    with small_filesystem(4) as disk:
        yield f"sqlite:///{disk / 'laggard.db'}", disk


@pytest.fixture
def postgres_on_small_disk(postgres_url):
    """The test database moved to a tablespace on a small filesystem (WAL stays on the server's disk)."""
    import psycopg

    from tests.conftest import POSTGRES_ADMIN_URL

    name, space = postgres_url.rsplit("/", 1)[1], f"laggard_t_{uuid.uuid4().hex[:12]}"
    with small_filesystem(24) as disk:
        location = disk / "pg"
        location.mkdir()
        try:
            shutil.chown(location, "postgres", "postgres")
        except (LookupError, PermissionError) as exc:
            _refuse(f"cannot hand the tablespace directory to the postgres user: {exc}")
        with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
            admin.execute(f"CREATE TABLESPACE \"{space}\" LOCATION '{location}'")
            admin.execute(f'ALTER DATABASE "{name}" SET TABLESPACE "{space}"')
        try:
            yield postgres_url, disk
        finally:
            with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                admin.execute(f'DROP TABLESPACE IF EXISTS "{space}"')


def _post(client: httpx.Client, body: dict) -> httpx.Response:
    content, headers = encode(body, gzipped=True)
    return client.post("/api/v1/samples", content=content, headers=headers)


def _sqlite_integrity(database_url: str) -> str:
    import sqlite3

    with contextlib.closing(sqlite3.connect(database_url.removeprefix("sqlite:///"))) as conn:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]


@pytest.mark.parametrize("store,workers", [("sqlite", 1), ("sqlite", 2), ("postgres", 1)],
                         ids=["sqlite", "sqlite-writer-process", "postgres"])
def test_disk_full_is_507_not_ready_and_recovers_once_space_is_freed(request, tmp_path, store, workers):
    database_url, disk = request.getfixturevalue(f"{store}_on_small_disk")
    logs = tmp_path / "logs"
    logs.mkdir()
    collector = CollectorProcess(database_url, logs, workers=workers, env={"LAGGARD_DETECTION_ENABLED": "false"}).start()
    t0 = time.time() - 86400
    acked: list[dict] = []
    refused: list[tuple[dict, httpx.Response]] = []
    try:
        # One keep-alive connection: with several workers, pushes and /readyz reach the same one.
        with httpx.Client(base_url=collector.url, timeout=60) as client:
            for k in range(3):
                body = batch(node=f"n{k}", samples=5, gpus=4, ts=t0 + 5 * k)
                assert _post(client, body).status_code == 200
                acked.append(body)

            filler = fill(disk)
            for k in range(3, MAX_PUSHES_UNTIL_FULL):
                body = batch(node=f"n{k % 8}", samples=20, gpus=8, ts=t0 + 20 * k)
                r = _post(client, body)
                if r.status_code == 200:
                    acked.append(body)
                else:
                    refused.append((body, r))
                    if len(refused) == 3:
                        break
            assert refused, "the database never ran out of space"
            assert [r.status_code for _, r in refused] == [507] * len(refused), [r.text for _, r in refused]
            detail = refused[0][1].json()["detail"]
            assert detail[0]["loc"] == ["database"] and detail[0]["type"] == "disk_full", detail
            assert "disk full" in detail[0]["msg"] and refused[0][1].headers["retry-after"]

            ready = client.get("/readyz")
            assert ready.status_code == 503, ready.text
            assert "disk full" in ready.json().get("writes", ""), ready.text
            assert client.get("/healthz").status_code == 200  # a restart would not help

            filler.unlink()
            deadline = time.monotonic() + RECOVERY_S
            for body, _ in refused:  # the agents' retries
                while _post(client, body).status_code != 200:
                    assert time.monotonic() < deadline, "ingest did not recover after space was freed"
                    time.sleep(0.2)
                acked.append(body)
            assert client.get("/readyz").status_code == 200
    finally:
        collector.stop()
    assert sample_keys(acked) <= stored_gpu_samples(database_url)
    if store == "sqlite":
        assert _sqlite_integrity(database_url) == "ok"
