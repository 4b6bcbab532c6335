"""Polling helpers for the Redis bridge tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shmbus import Bus
from tests.harness.wait import wait_for as harness_wait_for


def wait_for(pred: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    """:func:`harness.wait.wait_for` with the bridge tests' generous default deadline."""
    return harness_wait_for(pred, timeout, what)


def wait_relaying(*buses: Bus, timeout: float = 20.0) -> None:
    """Every host has a relay that is subscribed and caught up."""
    for bus in buses:
        wait_for(lambda b=bus: b.default.health()["relay_state"] == "relaying", timeout, f"relay of {bus.name}")
