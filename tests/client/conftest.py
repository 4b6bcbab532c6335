"""Fixtures for the client tests: real servers of every kind, and clients stopped (and checked) at teardown.

``target``      (module, parametrized over servers.KINDS) a running server; cases use their own channels
``server``      (module) the same over the lean worker and the gem only: the client's own features, which do not
                depend on the shmbus worker class
``new_target``  factory ``new_target(kind, **server options)`` -> a started Target of the test's own
``make_client`` factory ``make_client(url, **options)`` -> a started MessageBusClient with test-sized intervals
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from shmbus.client import MessageBusClient
from tests.harness.shm import bus_prefix

from .servers import KINDS, Target, make_target, shared_bus

#: intervals small enough for tests (the servers' long polls last 1 s)
FAST = {"min_poll_interval": 0.05, "max_poll_interval": 1.0, "callback_interval": 0.3, "timeout": 10.0}


@pytest.fixture(scope="module", params=KINDS)
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    yield from _module_target(str(request.param))


@pytest.fixture(scope="module", params=["lean", "gem"])
def server(request: pytest.FixtureRequest) -> Iterator[Target]:
    yield from _module_target(str(request.param))


def _module_target(kind: str) -> Iterator[Target]:
    bus = None if kind == "gem" else shared_bus(f"{bus_prefix()}{uuid.uuid4().hex[:10]}")
    t = make_target(kind, bus, lookups_from_headers=True)
    try:
        yield t.start()
    finally:
        t.close()
        if bus is not None:
            bus.destroy()


@pytest.fixture
def new_target(bus_name: str) -> Iterator[Callable[..., Target]]:
    made: list[Target] = []
    buses: list[Any] = []

    def make(kind: str, **opts: Any) -> Target:
        bus = None
        if kind != "gem":
            bus = shared_bus(f"{bus_name}{len(buses)}" if buses else bus_name)
            buses.append(bus)
        t = make_target(kind, bus, **opts)
        made.append(t)
        return t.start()

    try:
        yield make
    finally:
        for t in made:
            t.close()
        for b in buses:
            b.destroy()


@pytest.fixture
def make_client() -> Iterator[Callable[..., MessageBusClient]]:
    made: list[MessageBusClient] = []

    def make(url: str, **options: Any) -> MessageBusClient:
        c = MessageBusClient(url, **{**FAST, **options})
        made.append(c)
        c.start()
        return c

    yield make
    for c in made:
        c.stop()
    left = [t.name for t in threading.enumerate() if t.name.startswith("shmbus.client")]
    assert not left, f"client threads left behind: {left}"


@pytest.fixture
def channel() -> str:
    """A channel no other test on the shared server uses."""
    return f"/c{uuid.uuid4().hex[:12]}"
