"""Fixtures for the RabbitMQ bridge tests: "hosts" are buses with different segment names bridged to one stream.

The machine's broker (127.0.0.1:5672, guest/guest; ``AMQP_URL`` overrides it) with a stream per test, deleted
afterwards; tests that kill or freeze the broker use a private node (``rabbit_server``), never the machine's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from shmbus import Bus
from shmbus.adapters.rabbitmq import RabbitBridge
from shmbus.adapters.rabbitmq.connection import AmqpConnection
from shmbus.adapters.rabbitmq.errors import parse_url
from tests.harness.rabbitmq import RabbitServer, private_node, shared_broker


@pytest.fixture(scope="session")
def amqp_url() -> Iterator[str]:
    """The broker every test of this worker shares (a stream per test)."""
    yield from shared_broker()


@pytest.fixture
def stream(amqp_url: str, bus_name: str) -> Iterator[str]:
    """This test's stream name; the stream is deleted afterwards."""
    name = f"s_{bus_name}"
    yield name
    delete_stream(amqp_url, name)


def delete_stream(url: str, name: str) -> None:
    a = parse_url(url)
    conn = AmqpConnection(a.host, a.port, a.user, a.password, a.vhost, 10)
    try:
        conn.open_channel(1, 10)
        conn.delete(1, name, 10)
    finally:
        conn.close()


@pytest.fixture
def make_host(bus_name: str, amqp_url: str, stream: str) -> Iterator[Callable[..., Bus]]:
    """``make_host(suffix, **bridge_options)`` -> a bridged Bus named ``<bus_name><suffix>``; destroyed after."""
    buses: list[Bus] = []

    def make(suffix: str, *, url: str | None = None, bus_options: dict[str, Any] | None = None, **options: Any) -> Bus:
        options.setdefault("election_interval", 0.05)
        options.setdefault("stream", stream)
        bus = Bus(
            f"{bus_name}{suffix}",
            keepalive_interval=0,
            engine=RabbitBridge(url or amqp_url, **options),
            create=True,
            **(bus_options or {}),
        )
        buses.append(bus)
        return bus

    yield make
    for bus in buses:
        bus.destroy()


@pytest.fixture
def rabbit_server() -> Iterator[RabbitServer]:
    """A PRIVATE RabbitMQ node for tests that kill, freeze or restart the broker."""
    with private_node() as server:
        yield server
