"""What `pip install .` ships: every package of the source tree, and the migrations."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _declared() -> set[str]:
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])


def test_every_package_directory_is_declared():
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for top in ("agent", "server")
        for init in (ROOT / top).rglob("__init__.py")
    }
    missing = found - _declared()
    assert not missing, f"add to [tool.setuptools] packages in pyproject.toml: {sorted(missing)}"


def test_migrations_ship_with_their_template_and_versions():
    declared = _declared()
    assert {"laggard_migrations", "laggard_migrations.versions"} <= declared
    assert (ROOT / "migrations" / "script.py.mako").exists()
    assert list((ROOT / "migrations" / "versions").glob("0001_*.py"))


def test_the_agent_never_imports_the_server():
    offenders = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "agent").rglob("*.py")
        if any(line.lstrip().startswith(("import server", "from server")) for line in path.read_text().splitlines())
    ]
    assert offenders == []
