"""`laggard` as a user runs it with a configuration mistake: one line naming the problem and the
fix, exit 2, no traceback (issue #16); `--version`; no migration log lines unless asked."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from server import __version__


def laggard(*args: str, env: dict[str, str] | None = None, cwd=None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("LAGGARD_")} | (env or {})
    return subprocess.run([sys.executable, "-m", "server.cli", *args], capture_output=True, text=True, env=environ, cwd=cwd, timeout=60)


def test_version():
    proc = laggard("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"laggard {__version__}"


@pytest.mark.parametrize(("command", "url", "says"), [
    ("migrate", "postgresql+psycopg://postgres:s3cret@127.0.0.1:1/x", "cannot open the database postgresql+psycopg://postgres:***@127.0.0.1:1/x"),
    ("server", "postgresql+psycopg://postgres@127.0.0.1:1/x", "cannot open the database"),
    ("migrate", "bogus://x", "not a database URL Laggard can use: bogus://x"),
    ("server", "not a url", "not a database URL Laggard can use"),
    ("token", "sqlite:////no/such/dir/laggard.db", "cannot open the database sqlite:////no/such/dir/laggard.db"),
])
def test_an_unusable_database_is_one_line_and_exit_2(command, url, says):
    args = [command, "list"] if command == "token" else [command]
    proc = laggard(*args, env={"LAGGARD_DATABASE_URL": url, "LAGGARD_INSECURE": "1"})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"laggard {command}: ") and says in proc.stderr, proc.stderr
    assert "s3cret" not in proc.stderr and "Traceback" not in proc.stderr


def test_a_setting_of_the_wrong_type_is_one_line():
    proc = laggard("migrate", env={"LAGGARD_PORT": "eighty"})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "invalid setting port" in proc.stderr, proc.stderr


def test_migrate_and_token_print_no_migration_log_lines_unless_asked(tmp_path):
    env = {"LAGGARD_DATABASE_URL": f"sqlite:///{tmp_path / 'l.db'}"}
    proc = laggard("migrate", env=env)
    assert proc.returncode == 0 and proc.stdout.startswith("schema at revision")
    assert "alembic" not in proc.stdout + proc.stderr, proc.stderr
    proc = laggard("token", "create", "--scope", "read", env=env)
    assert proc.returncode == 0 and "alembic" not in proc.stdout + proc.stderr, proc.stderr
    proc = laggard("--log-level", "debug", "migrate", env={"LAGGARD_DATABASE_URL": f"sqlite:///{tmp_path / 'm.db'}"})
    assert "Running upgrade" in proc.stderr
