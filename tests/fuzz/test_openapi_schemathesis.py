"""schemathesis against the collector's own OpenAPI schema, over real HTTP with authentication
on: for every operation, generated requests (valid and invalid) never get a 5xx, and every
response matches what the schema says about it."""

from __future__ import annotations

import time

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from server.app import create_app
from server.serve import start_in_thread
from server.settings import Settings
from tests.auth.conftest import SecureCollector
from tests.metrics.fleet import push_range


@pytest.fixture(scope="module")
def collector(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'laggard.db'}"
    c = SecureCollector(Settings(database_url=url, insecure=False, rate_limit_per_s=1e6, rate_limit_burst=1e6,
                                 retention_interval_s=3600))
    # Something to read: a fleet with a hot GPU, so episodes, hints and series exist.
    insecure = start_in_thread(create_app(Settings(database_url=url, insecure=True, detection_enabled=False)))
    try:
        push_range(insecure.url, time.time() - 120, 0, 12, hot={"n2": (3,)})
    finally:
        insecure.stop()
    c.admin = c.token("admin")
    yield c
    c.close()


# The same document the server publishes at /openapi.json (tests/server checks that route).
schema = schemathesis.openapi.from_dict(create_app(Settings(database_url="sqlite://")).openapi())


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_5xx_and_responses_match_the_schema(case, collector):
    case.call_and_validate(base_url=collector.url, headers={"Authorization": f"Bearer {collector.admin}"},
                           checks=[not_a_server_error, response_schema_conformance])
