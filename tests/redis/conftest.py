"""Fixtures for the Redis bridge tests: "hosts" are buses with different segment names bridged to one Redis."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from shmbus import Bus
from shmbus.adapters.redis import RedisBridge


@pytest.fixture
def make_host(bus_name: str) -> Iterator[Callable[..., Bus]]:
    """``make_host(suffix, url, **bridge_options)`` -> a bridged Bus named ``<bus_name><suffix>``; destroyed after."""
    buses: list[Bus] = []

    def make(
        suffix: str,
        url: str,
        *,
        codec: str | None = None,
        bus_options: dict[str, Any] | None = None,
        **bridge_options: Any,
    ) -> Bus:
        bridge_options.setdefault("election_interval", 0.1)
        bus = Bus(
            f"{bus_name}{suffix}",
            codec=codec,
            keepalive_interval=0,
            engine=RedisBridge(url, **bridge_options),
            create=True,
            **(bus_options or {}),
        )
        buses.append(bus)
        return bus

    yield make
    for bus in buses:
        bus.destroy()


@pytest.fixture
def plain_bus(bus_name: str) -> Iterator[Callable[[str], Bus]]:
    """A non-bridged Bus on an existing host's segment, for reading it without joining the relay election."""
    buses: list[Bus] = []

    def make(suffix: str) -> Bus:
        bus = Bus(f"{bus_name}{suffix}", keepalive_interval=0, create=True)
        buses.append(bus)
        return bus

    yield make
    for bus in buses:
        bus.destroy()
