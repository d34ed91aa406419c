"""deploy/docker/*.Dockerfile and .dockerignore, without a Docker engine: the instructions read
statically (pinned base, non-root user, what pip installs, the command), and the build replayed
up to its `pip install`: the build context .dockerignore lets through, the COPY lines applied to
it, and pip resolving the same install target there (a dry run: what the image would get)."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agent.cli import parse_config
from server.cli.main import _parser as laggard_parser
from tests.deploy.tools import REPO

DOCKER = REPO / "deploy" / "docker"
IMAGES = {"agent": DOCKER / "agent.Dockerfile", "collector": DOCKER / "collector.Dockerfile"}
SERVER_ONLY = {"fastapi", "uvicorn", "sqlalchemy", "alembic", "psycopg", "pydantic-settings", "prometheus-client", "kubernetes"}


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order; continuation lines joined, comments dropped."""
    logical, current = [], ""
    for line in path.read_text().splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        logical.append(current + line)
        current = ""
    assert not current, f"{path.name}: dangling line continuation"
    return [(text.split(None, 1)[0].upper(), text.split(None, 1)[1].strip()) for text in logical]


def args_of(path: Path, name: str) -> list[str]:
    return [args for instr, args in instructions(path) if instr == name]


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list), f"not exec form: {args}"
    return value


def pip_install_targets(path: Path) -> list[str]:
    """The targets of every `pip install` in the RUN lines."""
    targets = []
    for run in args_of(path, "RUN"):
        for command in re.split(r"&&|;", run):
            words = shlex.split(command)
            if words[:2] == ["pip", "install"] or words[1:3] == ["-m", "pip"]:
                targets += [w for w in words[2:] if not w.startswith("-") and w != "install"]
    return targets


# --- static ------------------------------------------------------------------------------------


@pytest.mark.parametrize("image", IMAGES)
def test_base_image_is_python_311_slim_pinned_to_a_release(image):
    (base,) = args_of(IMAGES[image], "FROM")
    assert re.fullmatch(r"python:3\.11\.\d+-slim(-\w+)?", base), base


@pytest.mark.parametrize("image", IMAGES)
def test_image_runs_as_the_non_root_user_it_creates(image):
    path = IMAGES[image]
    user = args_of(path, "USER")[-1].split(":")[0]
    assert user not in ("root", "0")
    created = re.search(r"useradd [^&]*--uid (\d+)", " ".join(args_of(path, "RUN")))
    assert created and created.group(1) == user
    # The UID the Kubernetes manifests check with runAsNonRoot/runAsUser.
    manifest = (REPO / "deploy" / "kubernetes" / "base" / f"{image}.yaml").read_text()
    assert re.findall(r"runAsUser: (\d+)", manifest) and set(re.findall(r"runAsUser: (\d+)", manifest)) == {user}


def test_agent_image_installs_the_agent_alone():
    assert pip_install_targets(IMAGES["agent"]) == ["."]
    text = IMAGES["agent"].read_text()
    assert "[server]" not in text and not any(dep in text for dep in ("fastapi", "uvicorn", "psycopg"))
    assert exec_form(args_of(IMAGES["agent"], "CMD")[-1]) == ["laggard-agent"]
    parse_config([], env={})  # the bare command starts with the defaults


def test_collector_image_installs_the_server_and_serves_on_8080():
    assert pip_install_targets(IMAGES["collector"]) == [".[server]"]
    assert args_of(IMAGES["collector"], "EXPOSE") == ["8080"]
    cmd = exec_form(args_of(IMAGES["collector"], "CMD")[-1])
    assert cmd[:4] == ["laggard", "server", "--host", "0.0.0.0"]
    args = laggard_parser().parse_args(cmd[1:])
    assert (args.command, args.host) == ("server", "0.0.0.0")


def test_pyproject_extras_are_what_the_images_assume():
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = lambda deps: {re.split(r"[\[<>=~; ]", d, maxsplit=1)[0].lower() for d in deps}  # noqa: E731
    assert not names(project["dependencies"]) & SERVER_ONLY  # `pip install .` stays the agent's
    assert names(project["optional-dependencies"]["server"]) >= {"fastapi", "uvicorn", "sqlalchemy"}


# --- .dockerignore and the build context ------------------------------------------------------


def dockerignore_rules() -> list[tuple[bool, str]]:
    """(re-included?, pattern) in file order."""
    rules = []
    for line in (REPO / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            negate = line.startswith("!")
            rules.append((negate, line.lstrip("!").strip("/")))
    return rules


def _matches(pattern: str, path: str) -> bool:
    """Docker's rule: a pattern matching a directory matches everything under it; **/ may be empty."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    patterns = [pattern, pattern[3:]] if pattern.startswith("**/") else [pattern]
    return any(fnmatch.fnmatchcase(c, p) for c in candidates for p in patterns)


def in_context(path: str, rules: list[tuple[bool, str]]) -> bool:
    included = True
    for negate, pattern in rules:
        if _matches(pattern, path):
            included = negate
    return included


def build_context(dest: Path) -> None:
    """Copy what `docker build .` would send (files only; pruning trees no rule re-includes)."""
    rules = dockerignore_rules()
    reincluded = [p for negate, p in rules if negate]
    for top in sorted(REPO.iterdir()):
        if top.name == ".git" or (not in_context(top.name, rules) and not any(p.startswith(top.name) for p in reincluded)):
            continue
        files = [top] if top.is_file() else [f for f in top.rglob("*") if f.is_file()]
        for f in files:
            rel = f.relative_to(REPO).as_posix()
            if in_context(rel, rules):
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, dest / rel)


def test_dockerignore_keeps_the_context_to_the_sources():
    rules = dockerignore_rules()
    for kept in ("pyproject.toml", "README.md", "agent/cli.py", "server/app.py", "migrations/env.py"):
        assert in_context(kept, rules), kept
    for dropped in (".venv/bin/python", ".git/HEAD", "tests/conftest.py", "bench/ingest.py", "laggard.db",
                    "agent/__pycache__/cli.cpython-311.pyc", "docker-compose.yml"):
        assert not in_context(dropped, rules), dropped


def replay_copies(dockerfile: Path, context: Path, root: Path) -> Path:
    """Apply the Dockerfile's WORKDIR and COPY lines (before its first pip install) under `root`;
    the directory pip would run in."""
    workdir = Path("/")
    for instr, args in instructions(dockerfile):
        if instr == "WORKDIR":
            workdir = workdir / args
        elif instr == "COPY":
            *sources, target = args.split()
            assert not any(s.startswith("--") for s in sources), "COPY --from/--chown not replayed"
            for source in sources:
                src = context / source
                assert src.exists(), f"COPY {source}: not in the build context (.dockerignore?)"
                dest = root / (workdir / target).relative_to("/")
                if src.is_dir():
                    shutil.copytree(src, dest, dirs_exist_ok=True)
                else:
                    dest = dest / src.name if target.endswith("/") or target in (".", "./") else dest
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(src, dest)
        elif instr == "RUN" and "pip install" in args:
            return root / workdir.relative_to("/")
    raise AssertionError(f"{dockerfile.name}: no pip install")


@pytest.fixture(scope="module")
def context(tmp_path_factory):
    dest = tmp_path_factory.mktemp("context")
    build_context(dest)
    return dest


@pytest.mark.slow  # pip resolving the images' installs against the index: ~20 s of CPU, a minute on a busy machine
@pytest.mark.parametrize("image", IMAGES)
def test_image_install_resolves_from_its_build_context(image, context, tmp_path):
    """pip, in the directory the image builds in, resolves the Dockerfile's own target: the
    agent's gets no server dependency, the collector's gets them all."""
    workdir = replay_copies(IMAGES[image], context, tmp_path / "root")
    (target,) = pip_install_targets(IMAGES[image])
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report), target],
        cwd=workdir, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    installed = {item["metadata"]["name"].lower().replace("_", "-") for item in json.loads(report.read_text())["install"]}
    assert {"laggard", "nvidia-ml-py", "httpx"} <= installed
    if image == "agent":
        assert not installed & SERVER_ONLY, installed & SERVER_ONLY
    else:
        assert SERVER_ONLY <= installed, SERVER_ONLY - installed


def test_compose_builds_the_images_the_manifests_name():
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    built = {s["build"]["dockerfile"]: s["image"] for s in compose.values() if "build" in s}
    assert built == {"deploy/docker/agent.Dockerfile": "laggard-agent:0.1.0",
                     "deploy/docker/collector.Dockerfile": "laggard-collector:0.1.0"}
    for image, path in IMAGES.items():
        manifest = (REPO / "deploy" / "kubernetes" / "base" / f"{image}.yaml").read_text()
        assert f"image: laggard-{image}:0.1.0" in manifest
