from __future__ import annotations

import pytest
from sqlalchemy import func, select

from server.app import create_app
from server.serve import start_in_thread
from server.settings import Settings
from server.store import schema
from server.store.engine import make_engine


@pytest.fixture
def settings(database_url):
    return Settings(database_url=database_url, retention_interval_s=3600, rollup_interval_s=3600)


@pytest.fixture
def live_server(settings):
    """The app under real uvicorn on a loopback port: real HTTP round trips."""
    running = start_in_thread(create_app(settings))
    yield running
    running.stop()


@pytest.fixture
def db(settings):
    """An independent engine on the same database, to see what was really committed."""
    engine = make_engine(settings.database_url)
    yield engine
    engine.dispose()


def count_rows(engine, model) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(model.__table__)).scalar_one()


def stored_gpu_samples(engine) -> int:
    return count_rows(engine, schema.GpuSample)
