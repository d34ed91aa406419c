"""Shared fixtures: real databases (SQLite files and this machine's PostgreSQL)."""

from __future__ import annotations

import os
import uuid

import pytest

# Collectors built or started by the tests run without authentication unless a test turns it on
# (Settings(insecure=False), tests/server/test_auth.py): authentication has tests of its own.
os.environ.setdefault("LAGGARD_INSECURE", "1")

POSTGRES_ADMIN_URL = os.environ.get("LAGGARD_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


def _postgres_unavailable(reason: str):
    # Under CI a missing PostgreSQL is a failure, never a silent skip.
    if os.environ.get("CI"):
        pytest.fail(f"PostgreSQL required under CI but unreachable: {reason}")
    pytest.skip(f"PostgreSQL unreachable: {reason}")


@pytest.fixture
def postgres_url():
    """A fresh, empty database on the real server; dropped afterwards."""
    import psycopg

    name = f"laggard_t_{uuid.uuid4().hex[:12]}"
    try:
        admin = psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        _postgres_unavailable(str(exc))
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    base = POSTGRES_ADMIN_URL.rsplit("/", 1)[0]
    yield f"{base}/{name}"
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def sqlite_url(tmp_path):
    return f"sqlite:///{tmp_path / 'laggard.db'}"


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request):
    """Every storage test runs on both databases."""
    return request.getfixturevalue(f"{request.param}_url")


@pytest.fixture
def migrated_engine(database_url):
    """An engine on either database with the schema at head."""
    from server.store import migrate
    from server.store.engine import make_engine

    engine = make_engine(database_url)
    migrate.upgrade(engine)
    yield engine
    engine.dispose()
