"""Fixtures for the Web Push tests: a real RFC 8030 peer (the development push service, in-process), VAPID keys,
connectors.

``push_service``   a started :class:`~shmbus.adapters.push.devservice.PushService` (stopped at teardown)
``vapid``          fresh VAPID keys
``bus``            a fresh bus on ``bus_name`` (destroyed at teardown)
``pg_dsn``         a DSN whose ``search_path`` is a schema of this test's own (dropped afterwards)
``connector``      factory ``connector(**options) -> PushConnector`` on ``bus`` with a FileStore in tmp_path; every
                   connector is closed at teardown
Helpers shared by the test modules are in ``push_util`` (a module: conftest names collide across folders).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import harness

harness.require_module("pywebpush", "pip install -e '.[push]'")  # the push extra (skipped loudly without it)
from shmbus import Bus  # noqa: E402
from shmbus.adapters.push import FileStore, PushConnector, VapidKeys  # noqa: E402
from shmbus.adapters.push.devservice import PushService  # noqa: E402

from .push_util import LOOPBACK  # noqa: E402


@pytest.fixture
def push_service() -> Iterator[PushService]:
    service = PushService().start()
    try:
        yield service
    finally:
        service.stop()


@pytest.fixture
def vapid() -> VapidKeys:
    return VapidKeys.generate("mailto:ops@example.com")


@pytest.fixture
def bus(bus_name: str) -> Iterator[Bus]:
    b = Bus(bus_name, keepalive_interval=0, ring_size=1 << 22, max_channels=256, create=True)
    b.segment  # noqa: B018 - create it now
    try:
        yield b
    finally:
        b.destroy()


@pytest.fixture
def connector(bus: Bus, vapid: VapidKeys, tmp_path: Path) -> Iterator[Callable[..., PushConnector]]:
    made: list[PushConnector] = []

    def make(**options: Any) -> PushConnector:
        options.setdefault("channels", "/")
        options.setdefault("store", FileStore(str(tmp_path / "push")))
        options.setdefault("election_interval", 0.05)
        options.setdefault("timeout", 5.0)
        options.setdefault("allow_address", LOOPBACK)  # the local push service (the default refuses loopback)
        options.setdefault("allow_ports", None)  # on a port of its own (the default is 443 only)
        c = PushConnector(options.pop("bus", bus), vapid=options.pop("vapid", vapid), **options)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close(grace=0)


@pytest.fixture
def pg_dsn(database_url: str, bus_name: str) -> Any:
    psycopg = harness.require_module("psycopg")
    from tests.postgres.pg_util import dsn_for

    schema = f"s_{bus_name}".lower()
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield dsn_for(database_url, schema)
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
