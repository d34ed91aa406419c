"""The collector's CPython tuning (server/interpreter.py): set at start, from the settings."""

from __future__ import annotations

import gc
import sys

from fastapi.testclient import TestClient

from server import interpreter
from server.app import create_app


def test_the_switch_interval_is_the_setting_while_the_collector_runs(settings):
    before = sys.getswitchinterval()
    try:
        with TestClient(create_app(settings.model_copy(update={"gil_switch_interval_s": 0.0007}))):
            assert abs(sys.getswitchinterval() - 0.0007) < 1e-9
        sys.setswitchinterval(before)
        with TestClient(create_app(settings.model_copy(update={"gil_switch_interval_s": 0.0}))):
            assert sys.getswitchinterval() == before  # 0: Python's own left alone
    finally:
        sys.setswitchinterval(before)


def test_what_exists_at_start_is_frozen_once_per_process(settings):
    with TestClient(create_app(settings)):
        assert gc.get_freeze_count() > 0
    assert interpreter.freeze_once() is False  # already done: later apps' cycles stay collectable
