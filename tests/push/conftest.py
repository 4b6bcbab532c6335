"""Fixtures for the Web Push tests: a real RFC 8030 peer (``harness.push_service``), VAPID keys, connectors.

``push_service``   a started :class:`~harness.push_service.PushService` (stopped at teardown)
``vapid``          fresh VAPID keys
``bus``            a fresh bus on ``bus_name`` (destroyed at teardown)
``connector``      factory ``connector(**options) -> PushConnector`` on ``bus`` with a FileStore in tmp_path; every
                   connector is closed at teardown
``register``       ``register(connector, subscription, user_id, topics, site_id=None)``: stores a device as the REST
                   app would (same parser)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import harness
import pytest

harness.require_module("pywebpush", "pip install -e '.[push]'")  # the push extra (skipped loudly without it)
from harness.push_service import PushService  # noqa: E402
from harness.wait import wait_for  # noqa: E402

from shmbus import Bus  # noqa: E402
from shmbus.adapters.push import FileStore, PushConnector, VapidKeys  # noqa: E402
from shmbus.adapters.push.subscriptions import parse_registration  # noqa: E402

LOCAL: Callable[[str], bool] = lambda url: url.startswith("http://127.0.0.1:")  # noqa: E731 - the test peer only


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
    b = Bus(bus_name, keepalive_interval=0, ring_size=1 << 22, max_channels=256)
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
        c = PushConnector(options.pop("bus", bus), vapid=options.pop("vapid", vapid), **options)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close(grace=0)


def register(
    connector: PushConnector, subscription: dict[str, Any], user_id: Any, topics: list[str], site_id: str | None = None
) -> None:
    reg = parse_registration(
        {"subscription": subscription, "topics": topics}, user_id, site_id, connector.pushes, LOCAL, time.time()
    )
    connector.store.add(reg)


def wait_leading(connector: PushConnector, timeout: float = 10.0) -> None:
    wait_for(lambda: connector.leading, timeout, "the connector to become the sender")
