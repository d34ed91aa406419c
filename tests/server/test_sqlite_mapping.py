"""How much of the SQLite file the collector maps is a setting (LAGGARD_SQLITE_MMAP_MB):
mapped pages count in its RSS, which an operator may need to bound."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from server.app import create_app
from server.settings import Settings


def _mapped_bytes(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text("PRAGMA mmap_size")).scalar()


@pytest.mark.parametrize("environment, mapped", [({}, 256 << 20), ({"LAGGARD_SQLITE_MMAP_MB": "32"}, 32 << 20),
                                                 ({"LAGGARD_SQLITE_MMAP_MB": "0"}, 0)])
def test_every_connection_maps_what_the_setting_says(sqlite_url, monkeypatch, environment, mapped):
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    settings = Settings(database_url=sqlite_url, retention_interval_s=3600, detection_enabled=False)
    with TestClient(create_app(settings)) as client:
        assert _mapped_bytes(client.app.state.services.engine) == mapped


def test_a_negative_size_is_refused_at_start(monkeypatch, sqlite_url):
    monkeypatch.setenv("LAGGARD_SQLITE_MMAP_MB", "-1")
    with pytest.raises(ValueError, match="sqlite_mmap_mb"):
        Settings(database_url=sqlite_url)
