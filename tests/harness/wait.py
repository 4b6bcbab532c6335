"""Polling with a deadline (never a bare sleep as synchronisation)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(pred: Callable[[], Any], timeout: float = 10.0, what: str = "condition", *, interval: float = 0.01) -> Any:
    """Poll ``pred`` every ``interval`` seconds until it returns something truthy (returned);
    AssertionError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
