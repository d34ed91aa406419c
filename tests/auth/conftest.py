"""A collector with authentication on (the default everywhere but the tests' own collectors),
over real HTTP, and tokens made straight in its database."""

from __future__ import annotations

import httpx
import pytest

from server.app import create_app
from server.auth.store import create_token
from server.serve import start_in_thread
from server.settings import Settings
from server.store.engine import make_engine


class SecureCollector:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.server = start_in_thread(create_app(settings))
        self.url = self.server.url
        self.engine = make_engine(settings.database_url)

    def token(self, *scopes: str, cluster: str | None = None, nodes: list[str] | None = None) -> str:
        with self.engine.begin() as conn:
            return create_token(conn, scopes=frozenset(scopes), cluster=cluster, nodes=nodes)[0]

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def close(self) -> None:
        self.server.stop()
        self.engine.dispose()


@pytest.fixture
def secure_settings(sqlite_url) -> Settings:
    return Settings(database_url=sqlite_url, insecure=False, token_cache_s=0, detection_enabled=False, retention_interval_s=3600)


@pytest.fixture
def collector(secure_settings):
    c = SecureCollector(secure_settings)
    yield c
    c.close()
