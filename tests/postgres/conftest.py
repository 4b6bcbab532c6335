"""Fixtures for the PostgreSQL bridge tests: "hosts" are buses with different segment names bridged to one table.

Each test gets its own schema (the gem's ``message_bus`` table and the publish function live there; ``search_path``
in the DSN picks it) and its own notify channel, so tests in parallel never see each other's rows or notices.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from shmbus import Bus
from tests import harness
from tests.harness.services import PostgresServer, find_postgres_bindir

psycopg = harness.require_module("psycopg")  # the postgres extra; skipped (failed under SHMBUS_REQUIRE_ALL) if absent
from shmbus.adapters.postgres import PostgresBridge  # noqa: E402

from .pg_util import dsn_for  # noqa: E402


@pytest.fixture
def pg(database_url: str, bus_name: str) -> Iterator[dict[str, str]]:
    """``{"dsn", "schema", "channel", "url"}`` for this test (the schema is dropped afterwards)."""
    schema = f"s_{bus_name}".lower()
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield {
            "dsn": dsn_for(database_url, schema),
            "schema": schema,
            "channel": f"_mb_{bus_name}",
            "url": database_url,
        }
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture
def make_host(bus_name: str, pg: dict[str, str]) -> Iterator[Callable[..., Bus]]:
    """``make_host(suffix, **bridge_options)`` -> a bridged Bus named ``<bus_name><suffix>``; destroyed after."""
    buses: list[Bus] = []

    def make(suffix: str, *, dsn: str | None = None, bus_options: dict[str, Any] | None = None, **options: Any) -> Bus:
        options.setdefault("election_interval", 0.05)
        options.setdefault("notify_channel", pg["channel"])
        bus = Bus(
            f"{bus_name}{suffix}",
            keepalive_interval=0,
            engine=PostgresBridge(dsn or pg["dsn"], **options),
            create=True,
            **(bus_options or {}),
        )
        buses.append(bus)
        return bus

    yield make
    for bus in buses:
        bus.destroy()


@pytest.fixture
def sql(pg: dict[str, str]) -> Iterator[Any]:
    """An autocommit connection to this test's schema (to look at the table, or write as the gem does)."""
    with psycopg.connect(pg["dsn"], autocommit=True) as conn:
        yield conn


@pytest.fixture
def private_pg() -> Iterator[PostgresServer]:
    """A PostgreSQL cluster of the test's own, which it may SIGSTOP, restart or reconfigure."""
    bindir = find_postgres_bindir()
    if bindir is None:
        harness.skip_or_fail("no initdb/postgres binaries for a private PostgreSQL")
    server = PostgresServer(bindir).start()
    try:
        yield server
    finally:
        server.signal(signal.SIGCONT)  # never leave a stopped cluster behind
        server.close()
