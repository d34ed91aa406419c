"""Helpers of the deployment tests: external tools that are skipped locally when missing and fail
under CI (CI set), and the repository's paths."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent  # laggard, laggard-agent of the environment under test


def require_tool(name: str, how: str) -> str:
    """The tool's path. Missing: a failure under CI, a skip locally."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} not installed ({how})"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path
