"""Polling helpers for the Redis bridge tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from shmbus import Bus


def wait_for(pred: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    """Poll ``pred`` until truthy (generous deadline, never a bare sleep as synchronisation)."""
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


def wait_relaying(*buses: Bus, timeout: float = 20.0) -> None:
    """Every host has a relay that is subscribed and caught up."""
    for bus in buses:
        wait_for(lambda b=bus: b.default.health()["relay_state"] == "relaying", timeout, f"relay of {bus.name}")
