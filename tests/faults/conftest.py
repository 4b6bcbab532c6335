"""Fixtures of the fault suite: PRIVATE servers it may kill, and a cluster of hosts per scenario.

``backend`` is parametrized over ``redis``, ``postgres`` and ``rabbitmq`` (a scenario for one backend only overrides
it with ``@pytest.mark.parametrize("backend", ["postgres"], indirect=True)``). Redis: a private ``redis-server``
per test (the root conftest's ``redis_server``). PostgreSQL: one private cluster per xdist worker, a schema and notify
channel per test; a scenario that kills it restarts it, and a frozen one is thawed at teardown. RabbitMQ: one
private node per xdist worker, a stream per test (deleted at teardown). Never the
machine's own servers: they are shared.

``judge()`` ends a scenario: settle, run THE checker (faults_checker.py), put the scenario's row in the table the
terminal summary prints, and fail on any silent loss, duplicate, injection, disorder or unjustified reset.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import harness
from tests.harness.services import PostgresServer, find_postgres_bindir

from .faults_backends import Backend, PostgresBackend, RabbitBackend, RedisBackend
from .faults_checker import Verdict, check
from .faults_hosts import Cluster
from .faults_nats import nats_backend

#: The hang guard for RabbitMQ's scenarios (seconds; the suite's is 300): each of their connection kills is a
#: rabbitmqctl run, which boots an Erlang VM, and the load keeps publishing meanwhile. Under two busy loops on 2
#: cores test_connections_killed_repeatedly took 523 s and passed (21,515 messages checked; 9 s when quiet).
RABBITMQ_HANG_GUARD = 900


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if item.path.parent == here and "[rabbitmq" in item.name and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(RABBITMQ_HANG_GUARD))


@pytest.fixture(scope="session")
def faults_pg_server() -> Iterator[PostgresServer]:
    """A private PostgreSQL cluster for this worker's fault scenarios (they kill, freeze and restart it)."""
    harness.require_module("psycopg")
    bindir = find_postgres_bindir()
    if bindir is None:
        harness.skip_or_fail("no initdb/postgres binaries for a private PostgreSQL (apt-get install postgresql)")
    server = PostgresServer(bindir, synchronous_commit="on")  # an acknowledged row survives kill -9
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def faults_rabbit_server() -> Iterator[Any]:
    """A private RabbitMQ node for this worker's fault scenarios (they kill, freeze and restart it)."""
    from tests.harness.rabbitmq import private_node

    with private_node() as server:
        yield server


@pytest.fixture(params=["redis", "postgres", "nats", "rabbitmq"])
def backend(request: pytest.FixtureRequest, bus_name: str) -> Iterator[Backend]:
    channel = f"_mb_{bus_name}"
    if request.param == "nats":
        yield from nats_backend(bus_name)
        return
    if request.param == "rabbitmq":
        server = request.getfixturevalue("faults_rabbit_server")
        rabbit_backend = RabbitBackend(server, f"s_{bus_name}")
        try:
            yield rabbit_backend
        finally:
            server.thaw()
            server.start()  # a scenario may have left it down
            rabbit_backend.wipe()
        return
    if request.param == "redis":
        harness.require_module("redis")
        redis_backend = RedisBackend(request.getfixturevalue("redis_server"), channel)
        try:
            yield redis_backend
        finally:
            redis_backend.close()
        return
    server: PostgresServer = request.getfixturevalue("faults_pg_server")
    psycopg = harness.require_module("psycopg")
    schema = f"s_{bus_name}".lower()
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    pg_backend = PostgresBackend(server, schema, channel)
    try:
        yield pg_backend
    finally:
        pg_backend.close()
        server.thaw()
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture
def cluster(backend: Backend, bus_name: str, procs: Any) -> Iterator[Cluster]:
    c = Cluster(backend, bus_name, procs)
    try:
        yield c
    finally:
        backend.thaw()
        c.close()


@pytest.fixture
def judge(request: pytest.FixtureRequest, cluster: Cluster) -> Callable[[], Verdict]:
    """Settle the cluster, check it, record the table row, fail on any problem. Returns the verdict."""

    def run() -> Verdict:
        cluster.settle()
        name = request.node.name.removeprefix("test_")
        verdict = check(cluster, name)
        request.node.user_properties.append(("faults_row", verdict.row()))
        problems = verdict.problems()
        assert not problems, f"{name}: " + "; ".join(problems) + f" (publish errors: {verdict.errors})"
        return verdict

    return run
