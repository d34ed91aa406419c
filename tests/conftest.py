"""Shared fixtures: real databases (SQLite files and this machine's PostgreSQL); and how the suite
is run (issue #14 item 6): the slow end-to-end cases, the tests that share a module's fixture,
the order the workers take them in."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

# Collectors built or started by the tests run without authentication unless a test turns it on
# (Settings(insecure=False), tests/server/test_auth.py): authentication has tests of its own.
os.environ.setdefault("LAGGARD_INSECURE", "1")

# Each of the four workers imports every test module, assertions rewritten: 10 s of CPU a worker
# to collect when nothing is cached, 7 s when it is. Where bytecode is not to be written (PYTHONDONTWRITEBYTECODE), the
# rewritten modules are cached outside the tree instead.
if sys.dont_write_bytecode and sys.pycache_prefix is None:
    sys.pycache_prefix = os.path.join(tempfile.gettempdir(), f"laggard-pycache-{os.getuid()}")
    sys.dont_write_bytecode = False

POSTGRES_ADMIN_URL = os.environ.get("LAGGARD_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")

TESTS = Path(__file__).resolve().parent

# --- slow tests, and the order the workers take them in ---------------------------------------------

# Run by `.ci/run` (LAGGARD_TEST_SLOW=1), under CI (`CI` set), with `-m slow`, or when named (a path
# or node id on the command line); `python -m pytest` alone skips them.
RUN_SLOW_ENV = os.environ.get("LAGGARD_TEST_SLOW") == "1" or bool(os.environ.get("CI"))

# Slow tests in modules marked from here, not in the module: (node id prefix, part of the id).
SLOW_ELSEWHERE = (
    # The 1 s fleet (16 nodes, 20 minutes) built and judged four times: the suite's longest test,
    # 1½ to 3 minutes of CPU on a 2-core machine.
    # Its 5 s fleet, the same comparison at the other interval, stays in the default run.
    ("tests/detect/test_screen.py::", "[1s"),
)

# The longest tests (or modules handed out whole) the default run keeps, started first in this
# order so that none of them is the last to end.
FIRST = (
    "tests/detect/test_screen.py",
    "tests/detect/test_arrival_orders.py",
    "tests/metrics/test_collector.py",
    "tests/dashboards/test_dashboards.py",
    "tests/bench/test_fleetgen.py",
    "tests/ui/test_browser.py",
    "tests/server/test_writer_process.py",
    "tests/fuzz/",
    "tests/alerts/test_webhooks.py",
    "tests/metrics/test_slices.py",
    "tests/detect/test_service.py",
)


def _runs_everything(config: pytest.Config) -> bool:
    """No path narrower than the test directory named on the command line."""
    for arg in config.args:
        path = Path(arg.split("::", 1)[0])
        path = path if path.is_absolute() else Path(config.invocation_params.dir) / path
        if "::" in arg or path.resolve() != TESTS:
            return False
    return True


def _run_slow(config: pytest.Config) -> bool:
    return RUN_SLOW_ENV or "slow" in (config.option.markexpr or "") or not _runs_everything(config)


@pytest.hookimpl(tryfirst=True)  # before pytest orders the tests by their parametrized fixtures
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    run_slow = _run_slow(config)
    skip = pytest.mark.skip(reason="slow: run by .ci/run; LAGGARD_TEST_SLOW=1, -m slow or its path runs it here")
    for item in items:
        if any(item.nodeid.startswith(prefix) and part in item.nodeid for prefix, part in SLOW_ELSEWHERE):
            item.add_marker(pytest.mark.slow)
        if not run_slow and item.get_closest_marker("slow"):
            item.add_marker(skip)
    # Long tests first (the slow ones where they run, then FIRST in its order), whole modules at a
    # time: then the last tests to start are short ones, and no module's fixtures are built twice.
    rank: dict[str, int] = {}
    for item in items:
        module = _module_of(item.nodeid)
        r = -1 if run_slow and item.get_closest_marker("slow") else next((k for k, m in enumerate(FIRST) if module.startswith(m)), len(FIRST))
        rank[module] = min(r, rank.get(module, r))
    items.sort(key=lambda item: rank[_module_of(item.nodeid)])  # stable: the order within a rank stays


def _module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


MODULE_FIXTURE = re.compile(r"@pytest\.fixture\([^)]*scope=[\"'](module|class|package)[\"']")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`-n 4` (xdist's `load`): the tests are handed out one at a time in the order above, except
    that a module defining a module-scoped fixture (a Prometheus, a fleet, a built context) goes to
    one worker whole, which builds the fixture once; handed out one by one, each worker that got one
    of its tests built its own. (xdist's own `loadgroup` cannot do this under pytest 9: it renames
    node ids through an attribute pytest no longer reads.)"""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    shared: dict[str, bool] = {}

    def defines_module_fixture(module: str) -> bool:
        if module not in shared:
            path = config.rootpath / module
            shared[module] = path.suffix == ".py" and path.is_file() and bool(MODULE_FIXTURE.search(path.read_text()))
        return shared[module]

    class ModulesWithSharedFixtures(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = _module_of(nodeid)
            return module if defines_module_fixture(module) else nodeid

    config.option.loadscopereorder = False  # the order above, not the largest group first
    return ModulesWithSharedFixtures(config, log)


# --- databases ---------------------------------------------------------------------------------------


def _postgres_unavailable(reason: str):
    # Under CI a missing PostgreSQL is a failure, never a silent skip.
    if os.environ.get("CI"):
        pytest.fail(f"PostgreSQL required under CI but unreachable: {reason}")
    pytest.skip(f"PostgreSQL unreachable: {reason}")


def _admin():
    import psycopg

    try:
        return psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        _postgres_unavailable(str(exc))


def _postgres_database(template: str | None = None) -> str:
    name = f"laggard_t_{uuid.uuid4().hex[:12]}"
    with _admin() as admin:
        admin.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
    return name


def _drop_postgres_database(name: str) -> None:
    import psycopg

    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _url_of(name: str) -> str:
    return f"{POSTGRES_ADMIN_URL.rsplit('/', 1)[0]}/{name}"


class _Migrated:
    """One database of each kind per worker with the schema at head, made the way every test
    database was (migrate.upgrade on an empty one), then copied for each test that would migrate
    its own first thing: the same schema, revision and rows, without running the migrations again.
    PostgreSQL's day partitions depend on the day: a new day makes a new template."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.dir = Path(tempfile.mkdtemp(prefix="laggard-migrated-"))
        self.sqlite: Path | None = None
        self.postgres: dict[int, str] = {}

    def _upgrade(self, url: str) -> None:
        from server.store import migrate
        from server.store.engine import make_engine

        engine = make_engine(url)
        try:
            migrate.upgrade(engine)
        finally:
            engine.dispose()

    def sqlite_copy(self, dest: Path) -> None:
        with self.lock:
            if self.sqlite is None:
                path = self.dir / "laggard.db"
                self._upgrade(f"sqlite:///{path}")
                self.sqlite = path
        for suffix in ("", "-wal"):  # closed cleanly: the WAL is checkpointed and gone
            if Path(f"{self.sqlite}{suffix}").exists():
                shutil.copyfile(f"{self.sqlite}{suffix}", f"{dest}{suffix}")

    def postgres_template(self) -> str:
        day = int(time.time() // 86400)
        with self.lock:
            if day not in self.postgres:
                name = _postgres_database()
                try:
                    self._upgrade(_url_of(name))
                except BaseException:
                    _drop_postgres_database(name)
                    raise
                self.postgres[day] = name
            return self.postgres[day]

    def close(self) -> None:
        for name in self.postgres.values():
            _drop_postgres_database(name)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def _migrated():
    migrated = _Migrated()
    yield migrated
    migrated.close()


# Fixtures whose first act on the test's database is migrating it to head: the collector's start
# (create_app's lifespan) and migrated_engine. A test using one gets its database already migrated.
MIGRATES_FIRST = {"migrated_engine", "live_server"}


def _migrates_first(request) -> bool:
    return bool(MIGRATES_FIRST & set(request.fixturenames))


@contextlib.contextmanager
def new_database_url(kind: str, directory: Path) -> Iterator[str]:
    """A fresh, empty database ("sqlite": a file in `directory`; "postgres": on the real server,
    dropped afterwards), for fixtures that outlive a test."""
    if kind == "sqlite":
        yield f"sqlite:///{directory / 'laggard.db'}"
        return
    name = _postgres_database()
    try:
        yield _url_of(name)
    finally:
        _drop_postgres_database(name)


@pytest.fixture
def postgres_url(request):
    """A fresh database on the real server (empty, or at head where the test's fixtures migrate it
    first); dropped afterwards."""
    template = request.getfixturevalue("_migrated").postgres_template() if _migrates_first(request) else None
    name = _postgres_database(template)
    yield _url_of(name)
    _drop_postgres_database(name)


@pytest.fixture
def sqlite_url(request, tmp_path):
    path = tmp_path / "laggard.db"
    if _migrates_first(request):
        request.getfixturevalue("_migrated").sqlite_copy(path)
    return f"sqlite:///{path}"


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request):
    """Every storage test runs on both databases."""
    return request.getfixturevalue(f"{request.param}_url")


@pytest.fixture
def migrated_engine(database_url):
    """An engine on either database with the schema at head."""
    from server.store import migrate
    from server.store.engine import make_engine

    engine = make_engine(database_url)
    migrate.upgrade(engine)
    yield engine
    engine.dispose()
