"""Shared fixtures for every shmbus test (see tests/harness/ for the helpers behind them).

Fixtures:
  bus_name        (function) unique bus name per test and xdist worker: ``t<pid>_<10 hex>``
  redis_url       (session)  REDIS_URL, else 127.0.0.1:6379 if it answers, else a private redis-server
  redis_server    (function) a PRIVATE redis-server for tests that stop/kill/restart Redis
  database_url    (session)  DATABASE_URL, else postgres@127.0.0.1:5432/test, else a private cluster
  procs           (function) ProcessTracker: spawn_python/spawn/gunicorn_server/uvicorn_server, all
                             process groups killed at teardown
  gunicorn_server (function) factory: ``gunicorn_server("mod:app", workers=2, ...) -> Server``
  uvicorn_server  (function) factory: ``uvicorn_server("mod:app", workers=1, ...) -> Server``
SHMBUS_PRIVATE_SERVICES=1 skips the machine's default Redis/PostgreSQL and always starts private
ones (isolation, and a way to exercise the fresh-machine path on a machine that has them).
Autouse, per session (= per xdist worker): fail if this worker's buses left files in /dev/shm,
or if a harness-started process is still running at the end.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from uuid import uuid4

import pytest

from tests.harness import require_all, skip_or_fail
from tests.harness.procs import ProcessTracker, Server, kill_stragglers
from tests.harness.services import (
    DEFAULT_DATABASE_URL,
    DEFAULT_REDIS_URL,
    PostgresServer,
    RedisServer,
    find_postgres_bindir,
    postgres_problem,
    redis_ping,
    redis_url_problem,
)
from tests.harness.shm import SHM_DIR, bus_prefix, files_for_bus, shm_files
from tests.harness.table import format_table

_REDIS_HOW = "apt-get install redis-server (or run scripts/test), or set REDIS_URL"
_PG_HOW = (
    "start it (pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start), "
    "apt-get install postgresql (or run scripts/test), or set DATABASE_URL"
)

# (nodeid, files) of buses that still had segments when their test ended.
_LEFTOVERS: list[tuple[str, list[str]]] = []
# Rows of the fault suite's table (tests/faults: each scenario records one as a user property; under xdist the
# reports carry them to the controller, which prints them in the terminal summary).
_FAULT_ROWS: list[dict[str, object]] = []


def pytest_report_header(config: pytest.Config) -> str:
    mode = "missing services FAIL tests" if require_all() else "missing services skip tests"
    return f"shmbus harness: SHMBUS_REQUIRE_ALL={os.environ.get('SHMBUS_REQUIRE_ALL', '')!r} ({mode})"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call":
        result = "xfail (known bug)" if hasattr(report, "wasxfail") else report.outcome
        _FAULT_ROWS.extend(
            {**value, "result": result}  # type: ignore[dict-item]
            for name, value in report.user_properties
            if name == "faults_row"
        )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _FAULT_ROWS:
        return
    terminalreporter.write_sep("=", "fault scenarios: every acknowledged publish delivered, or its loss reported")
    for line in format_table(sorted(_FAULT_ROWS, key=lambda r: str(r["scenario"]))):
        terminalreporter.write_line(line)


@pytest.fixture
def bus_name(request: pytest.FixtureRequest) -> Iterator[str]:
    """A bus name no other test or xdist worker uses; its /dev/shm files are checked at the end."""
    name = f"{bus_prefix()}{uuid4().hex[:10]}"
    yield name
    left = files_for_bus(name)
    if left:
        _LEFTOVERS.append((request.node.nodeid, sorted(left)))


@pytest.fixture(scope="session", autouse=True)
def _shm_leak_check() -> Iterator[None]:
    """Fail the session if buses named by this worker's bus_name left files in /dev/shm."""
    prefix = bus_prefix()
    before = shm_files(prefix)
    yield
    leaked = sorted(shm_files(prefix) - before)
    if not leaked:
        return
    by_test = "\n".join(f"  {nodeid}: {', '.join(files)}" for nodeid, files in _LEFTOVERS)
    for name in leaked:  # report, then clean up so the machine stays tidy
        try:
            (SHM_DIR / name).unlink()
        except OSError:
            pass
    pytest.fail(
        f"shared-memory leak: this worker's tests left {len(leaked)} file(s) in {SHM_DIR} "
        f"(removed now): {', '.join(leaked)}\n"
        f"tests whose bus still had files at teardown:\n{by_test or '  (none recorded per test)'}\n"
        "Every bus a test creates must be closed/destroyed (unlinked) before the test ends.",
        pytrace=False,
    )


@pytest.fixture(scope="session", autouse=True)
def _no_stray_processes() -> Iterator[None]:
    """Kill harness-started processes still running at session end, and fail loudly about them."""
    yield
    stray = kill_stragglers()
    if stray:
        pytest.fail(
            "processes started by the harness were still running at session end (killed now):\n  "
            + "\n  ".join(stray)
            + "\nStop them in the test, or start them with the `procs` fixture.",
            pytrace=False,
        )


@pytest.fixture
def procs() -> Iterator[ProcessTracker]:
    """Start real child processes; every process group it started is killed at teardown."""
    tracker = ProcessTracker()
    try:
        yield tracker
    finally:
        tracker.cleanup()


@pytest.fixture
def gunicorn_server(procs: ProcessTracker) -> Callable[..., Server]:
    """Factory: ``gunicorn_server(app_spec, workers=2, worker_class="sync", config=None, env=None,
    *, app_dir=None, extra_args=(), timeout=30.0) -> Server`` (stopped at teardown)."""
    return procs.gunicorn_server


@pytest.fixture
def uvicorn_server(procs: ProcessTracker) -> Callable[..., Server]:
    """Factory: ``uvicorn_server(app_spec, workers=1, env=None, *, app_dir=None, extra_args=(),
    timeout=30.0) -> Server`` (stopped at teardown)."""
    return procs.uvicorn_server


def _private_services() -> bool:
    value = os.environ.get("SHMBUS_PRIVATE_SERVICES", "")
    return value.strip().lower() not in ("", "0", "false", "no", "off")


def _redis_binary() -> str | None:
    return shutil.which("redis-server") or (
        "/usr/bin/redis-server" if os.access("/usr/bin/redis-server", os.X_OK) else None
    )


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A Redis URL shared by this worker's tests (namespace keys with ``bus_name``).

    REDIS_URL if set; else 127.0.0.1:6379 if it answers PING; else a private redis-server on a
    free port for this session; else skip (fail under SHMBUS_REQUIRE_ALL).
    """
    env_url = os.environ.get("REDIS_URL")
    if env_url:
        problem = redis_url_problem(env_url)
        if problem:
            skip_or_fail(f"REDIS_URL is set but {problem}")
        yield env_url
        return
    if not _private_services() and redis_ping("127.0.0.1", 6379) == "+PONG":
        yield DEFAULT_REDIS_URL
        return
    binary = _redis_binary()
    if binary is None:
        skip_or_fail(f"no Redis: no PING answer on 127.0.0.1:6379, no redis-server binary ({_REDIS_HOW})")
    server = RedisServer(binary)
    try:
        server.start()
        yield server.url
    finally:
        server.close()


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A PRIVATE redis-server for this test only: ``.url``, ``.port``, ``.stop()``, ``.kill()``,
    ``.start()`` (same port), ``.restart()``; killed and its temp dir removed at teardown."""
    binary = _redis_binary()
    if binary is None:
        skip_or_fail(f"no redis-server binary to start a private Redis ({_REDIS_HOW})")
    server = RedisServer(binary)
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    """A PostgreSQL URL: DATABASE_URL if set; else postgres@127.0.0.1:5432/test if it accepts a
    connection; else a private throw-away cluster; else skip (fail under SHMBUS_REQUIRE_ALL)."""
    env_url = os.environ.get("DATABASE_URL")
    if env_url:
        problem = postgres_problem(env_url)
        if problem:
            skip_or_fail(f"DATABASE_URL is set but {problem}")
        yield env_url
        return
    private = _private_services()
    problem = "SHMBUS_PRIVATE_SERVICES is set" if private else postgres_problem(DEFAULT_DATABASE_URL)
    if problem is None:
        yield DEFAULT_DATABASE_URL
        return
    bindir = find_postgres_bindir()
    if bindir is None:
        skip_or_fail(f"no PostgreSQL: {problem}, and no initdb/postgres binaries to start one ({_PG_HOW})")
    try:
        server = PostgresServer(bindir)
    except KeyError:
        skip_or_fail(f"no PostgreSQL: {problem}; running as root but there is no 'postgres' user ({_PG_HOW})")
    try:
        server.start()
        yield server.url
    finally:
        server.close()
