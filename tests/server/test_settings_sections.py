"""One settings section per component (#14 item 3), and every flat name of earlier versions still
working: each legacy LAGGARD_<NAME> variable and Settings(<name>=...) keyword lands in its section,
the nested LAGGARD_<SECTION>__<NAME> works too, and the sources keep their order."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import yaml
from pydantic import SecretStr

from server.alerts.settings import AlertSettings
from server.settings import LEGACY_NAMES, Settings, settings_from_flags

ROOT = Path(__file__).resolve().parents[2]

# Every legacy name: the text an operator sets, and what the setting then holds.
CASES: dict[str, tuple[str, object]] = {
    "insecure": ("true", True),
    "metrics_public": ("true", True),
    "scheduler_public": ("1", True),
    "token_cache_s": ("3.5", 3.5),
    "rate_limit_per_s": ("12", 12.0),
    "rate_limit_burst": ("34", 34.0),
    "max_body_bytes": ("1024", 1024),
    "max_future_skew_s": ("60", 60.0),
    "body_timeout_s": ("4", 4.0),
    "gpu_move_after_s": ("90", 90.0),
    "ingest_writer_threads": ("3", 3),
    "ingest_group_max_bodies": ("8", 8),
    "ingest_slice_rows": ("512", 512),
    "ingest_small_rows": ("0", 0),
    "ingest_heavy_wait_s": ("0.2", 0.2),
    "write_failure_unready_s": ("5", 5.0),
    "ingest_writer_socket": ("/run/laggard/writer.sock", "/run/laggard/writer.sock"),
    "ingest_writer_key": ("abcd", "abcd"),
    "raw_retention_hours": ("6", 6.0),
    "rollup_retention_days": ("7", 7.0),
    "event_retention_days": ("30", 30.0),
    "retention_days": ("2", 2.0),
    "retention_interval_s": ("3600", 3600.0),
    "rollup_interval_s": ("15", 15.0),
    "detection_enabled": ("false", False),
    "detection_poll_s": ("0.05", 0.05),
    "leader_retry_s": ("1", 1.0),
    "webhook_urls": ("http://a.example/1,http://b.example/2", "http://a.example/1,http://b.example/2"),
    "webhook_secret": ("s3cret", "s3cret"),
}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """No LAGGARD_* variable but the test's own (tests/conftest.py sets LAGGARD_INSECURE)."""
    import os

    for key in list(os.environ):
        if key.upper().startswith("LAGGARD_"):
            monkeypatch.delenv(key)


def held(settings: Settings, name: str) -> object:
    """What the setting a legacy name maps to holds (secrets unwrapped)."""
    section, field = LEGACY_NAMES[name]
    value = getattr(getattr(settings, section), field)
    return value.get_secret_value() if isinstance(value, SecretStr) else value


def nested_env(name: str) -> str:
    section, field = LEGACY_NAMES[name]
    return f"LAGGARD_{section}__{field}".upper()


def test_every_legacy_name_has_a_case_and_a_home():
    assert set(CASES) == set(LEGACY_NAMES)
    for name, (section, field) in LEGACY_NAMES.items():
        assert name not in Settings.model_fields, f"{name} is a section's setting now, not a top-level one"
        assert field in Settings.model_fields[section].annotation.model_fields, (name, section, field)
        assert held(Settings(), name) != CASES[name][1], f"{name}: pick a case value other than the default"


@pytest.mark.parametrize("name", sorted(CASES))
def test_legacy_env_name_lands_in_its_section(monkeypatch, name):
    monkeypatch.setenv(f"LAGGARD_{name.upper()}", CASES[name][0])
    assert held(Settings(), name) == CASES[name][1]


@pytest.mark.parametrize("name", sorted(CASES))
def test_legacy_keyword_lands_in_its_section(name):
    assert held(Settings(**{name: CASES[name][1]}), name) == CASES[name][1]
    assert held(Settings.model_validate({name: CASES[name][1]}), name) == CASES[name][1]


@pytest.mark.parametrize("name", sorted(CASES))
def test_nested_env_name_sets_the_section(monkeypatch, name):
    monkeypatch.setenv(nested_env(name), CASES[name][0])
    assert held(Settings(), name) == CASES[name][1]


@pytest.mark.parametrize("name", sorted(CASES))
def test_nested_keyword_sets_the_section(name):
    section, field = LEGACY_NAMES[name]
    assert held(Settings(**{section: {field: CASES[name][1]}}), name) == CASES[name][1]


def test_legacy_env_names_are_case_insensitive_like_the_rest(monkeypatch):
    monkeypatch.setenv("laggard_token_cache_s", "4")
    assert Settings().auth.token_cache_s == 4.0


def test_nested_env_name_wins_over_the_legacy_one(monkeypatch):
    monkeypatch.setenv("LAGGARD_TOKEN_CACHE_S", "3")
    monkeypatch.setenv("LAGGARD_AUTH__TOKEN_CACHE_S", "5")
    assert Settings().auth.token_cache_s == 5.0


def test_keywords_win_over_the_environment_whichever_names_either_uses(monkeypatch):
    monkeypatch.setenv("LAGGARD_AUTH__TOKEN_CACHE_S", "5")
    monkeypatch.setenv("LAGGARD_RAW_RETENTION_HOURS", "6")
    settings = Settings(token_cache_s=1, retention={"raw_hours": 2})
    assert (settings.auth.token_cache_s, settings.retention.raw_hours) == (1.0, 2.0)


def test_legacy_and_nested_names_of_one_section_combine(monkeypatch):
    monkeypatch.setenv("LAGGARD_INSECURE", "1")
    monkeypatch.setenv("LAGGARD_AUTH__RATE_LIMIT_BURST", "9")
    monkeypatch.setenv("LAGGARD_ALERTS__ROUTES_FILE", "/etc/laggard/routes.yaml")
    settings = Settings(webhook_urls="http://a.example/1", alerts=AlertSettings(group_wait_s=0.5))
    assert (settings.auth.insecure, settings.auth.rate_limit_burst) == (True, 9.0)
    # A section given whole replaces its variables (pydantic-settings' rule); a legacy keyword beside it joins it.
    assert (settings.alerts.webhook_urls, settings.alerts.group_wait_s, settings.alerts.routes_file) == ("http://a.example/1", 0.5, None)


def test_the_old_single_retention_horizon_still_sets_raw_retention():
    assert Settings().retention.raw_s == 48 * 3600
    assert Settings(raw_retention_hours=6).retention.raw_s == 6 * 3600
    assert Settings(retention_days=7).retention.raw_s == 7 * 86400


def test_writer_threads_follow_the_database():
    assert Settings(database_url="sqlite:///x.db").writer.threads_for(True) == 1
    assert Settings().writer.threads_for(False) == 4
    assert Settings(ingest_writer_threads=2).writer.threads_for(True) == 2


def test_flags_name_settings_by_their_old_names(monkeypatch):
    monkeypatch.setenv("LAGGARD_AUTH__INSECURE", "false")
    flags = argparse.Namespace(insecure=True, port=9000, host=None)
    settings = settings_from_flags(flags)
    assert (settings.auth.insecure, settings.port) == (True, 9000)  # the flag wins over the variable


def test_with_changes_takes_old_and_section_names():
    base = Settings(detection_poll_s=0.1)
    changed = base.with_changes({"migrate_on_start": False, "ingest_writer_socket": "/tmp/w.sock",
                                 "ingest_writer_key": SecretStr("ab"), "auth": {"token_cache_s": 0}})
    assert changed.migrate_on_start is False
    assert (changed.writer.socket, changed.writer.key.get_secret_value()) == ("/tmp/w.sock", "ab")
    assert (changed.auth.token_cache_s, changed.detector.poll_s) == (0, 0.1)
    assert base.writer.socket is None and base.auth.token_cache_s == 10.0  # a copy


def test_docs_name_every_section_setting_and_every_legacy_name():
    doc = (ROOT / "docs" / "configuration.md").read_text()
    for name in LEGACY_NAMES:
        assert f"`LAGGARD_{name.upper()}`" in doc, name
        assert f"`{nested_env(name)}`" in doc, nested_env(name)


def test_deployments_variables_are_still_settings():
    """Each LAGGARD_* variable the collector's manifests set names a setting: top-level, legacy or nested."""
    config = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "base" / "collector-config.yaml").read_text())
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    names = set(config["data"]) | set(compose["services"]["collector"]["environment"])
    assert {"LAGGARD_RAW_RETENTION_HOURS", "LAGGARD_METRICS_PUBLIC", "LAGGARD_INSECURE"} <= names
    for var in names:
        name = var.removeprefix("LAGGARD_").lower()
        section = re.split("__", name)[0]
        assert name in Settings.model_fields or name in LEGACY_NAMES or (section in Settings.model_fields and "__" in name), var
