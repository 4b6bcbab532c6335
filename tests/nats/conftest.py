"""Fixtures for the NATS bridge tests: "hosts" are buses with different segment names bridged to one stream.

Each test gets its own stream (named after its bus), deleted afterwards. ``nats_url``: the machine's NATS if it
runs JetStream on 127.0.0.1:4222 (SHMBUS_PRIVATE_SERVICES=1: never), else one private server per worker;
``nats_server``: a private server of the test's own, which it may kill, freeze or restart.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from shmbus import Bus
from shmbus.adapters.nats import NatsBridge
from shmbus.adapters.nats import jetstream as js
from shmbus.adapters.nats.client import NatsConnection
from tests.harness import skip_or_fail
from tests.harness.nats import DEFAULT_NATS_URL, NATS_HOW, NatsServer, find_nats_server, nats_jetstream


def private_server(**options: Any) -> NatsServer:
    binary = find_nats_server()
    if binary is None:
        skip_or_fail(f"no nats-server binary to start a private NATS ({NATS_HOW})")
    return NatsServer(binary, **options).start()


@pytest.fixture(scope="session")
def nats_url() -> Iterator[str]:
    if os.environ.get("SHMBUS_PRIVATE_SERVICES") != "1" and nats_jetstream():
        yield DEFAULT_NATS_URL
        return
    server = private_server()
    try:
        yield server.url
    finally:
        server.close()


@pytest.fixture
def nats_server() -> Iterator[NatsServer]:
    server = private_server()
    try:
        yield server
    finally:
        server.close()


def js_conn(url: str) -> NatsConnection:
    return NatsConnection(url, timeout=10, connect_timeout=5)


@pytest.fixture
def make_host(bus_name: str, nats_url: str) -> Iterator[Callable[..., Bus]]:
    """``make_host(suffix, url=None, bus_options=None, **bridge_options)`` -> a bridged Bus on this test's stream."""
    buses: list[Bus] = []
    urls = {nats_url}

    def make(suffix: str, *, url: str | None = None, bus_options: dict[str, Any] | None = None, **options: Any) -> Bus:
        options.setdefault("election_interval", 0.05)
        options.setdefault("stream", bus_name)
        urls.add(url or nats_url)
        bus = Bus(
            f"{bus_name}{suffix}",
            keepalive_interval=0,
            engine=NatsBridge(url or nats_url, **options),
            create=True,
            **(bus_options or {}),
        )
        buses.append(bus)
        return bus

    yield make
    for bus in buses:
        bus.destroy()
    for url in urls:
        with contextlib.suppress(Exception):
            conn = js_conn(url)
            try:
                js.api(conn, f"STREAM.DELETE.{bus_name}")
            except js.JsError:
                pass
            conn.close()
