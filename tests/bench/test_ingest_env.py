"""bench/ingest.py and bench/fleet_scale.py measure capacity, not admission: the collectors they
start must not refuse their one token's pushes. bench/ingest.py once lifted only the request rate
limit, so a third of its requests got 429 from the limits by work (issue #12's 5,000 rows/s per
token); a limit added later must be lifted there too."""

from __future__ import annotations

import pytest

from bench.ingest import CAPACITY_NOT_ADMISSION
from server.ingest.settings import IngestLimits
from server.settings import Settings

# The limits by work that are rates or bursts (the others bound a count, not the pace).
PACED = [name for name in IngestLimits.model_fields if name.startswith(("rows_", "node_registrations_"))]


@pytest.fixture
def bench_settings(monkeypatch) -> Settings:
    for name, value in CAPACITY_NOT_ADMISSION.items():
        monkeypatch.setenv(name, value)
    return Settings(database_url="sqlite:///unused.db")


@pytest.mark.parametrize("name", PACED)
def test_every_limit_by_work_is_lifted(bench_settings, name):
    assert getattr(bench_settings.ingest_limits, name) >= 1e9


def test_the_request_rate_limit_is_lifted(bench_settings):
    assert bench_settings.auth.rate_limit_per_s >= 1e9 and bench_settings.auth.rate_limit_burst >= 1e9
