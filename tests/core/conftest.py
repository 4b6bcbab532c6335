"""Fixtures for the core tests: a real bus per test, destroyed afterwards."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

import shmbus


@pytest.fixture
def make_bus(bus_name: str) -> Iterator[Callable[..., shmbus.Bus]]:
    """Factory for Bus objects on this test's bus name (several may attach to one segment)."""
    made: list[shmbus.Bus] = []

    def make(**options: Any) -> shmbus.Bus:
        options.setdefault("ring_size", 1 << 20)
        options.setdefault("keepalive_interval", 0)
        options.setdefault("create", True)
        bus = shmbus.Bus(options.pop("name", bus_name), **options)
        made.append(bus)
        return bus

    yield make
    for bus in made:
        bus.destroy()


@pytest.fixture
def bus(make_bus: Callable[..., shmbus.Bus]) -> shmbus.Bus:
    return make_bus()
