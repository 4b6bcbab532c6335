"""Fixtures and clients for the transport tests (SSE, WebSocket, REST publish).

``bus``          a fresh Bus on ``bus_name`` (destroyed at teardown)
``server``       factory ``server(**env) -> Server``: ``transport_apps:app`` under a real uvicorn (bus from env)
``publisher``    ``publisher(bus_name, [(channel, data, kwargs), ...])``: publishes from ANOTHER process
``sse``          factory ``sse(url, params, headers) -> SSEClient`` (closed at teardown; see transport_util.py)
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from shmbus import Bus

from .transport_util import SSEClient

APP_DIR = Path(__file__).resolve().parent


@pytest.fixture
def bus(bus_name: str) -> Iterator[Bus]:
    b = Bus(bus_name, keepalive_interval=0, ring_size=1 << 22, max_channels=256, create=True)
    b.segment  # create it now: servers and publishers attach to it by name  # noqa: B018
    try:
        yield b
    finally:
        b.destroy()


@pytest.fixture
def server(procs: Any, bus_name: str) -> Callable[..., Any]:
    def start(**env: str) -> Any:
        full = {"SHMBUS_TEST_BUS": bus_name, **env}
        return procs.uvicorn_server("transport_apps:app", workers=1, env=full, app_dir=APP_DIR, health_path="/health")

    return start


PUBLISH_CODE = r"""
import json, sys
from shmbus import Bus
bus = Bus(sys.argv[1], keepalive_interval=0, create=False)
ids = []
for channel, data, kwargs in json.loads(sys.stdin.read()):
    ids.append(bus.publish(channel, data, **kwargs))
bus.close()
print(json.dumps(ids))
"""


@pytest.fixture
def publisher(procs: Any) -> Callable[[str, list[Any]], list[int]]:
    """Publish from a separate process attached to the bus by name; returns the message ids."""

    def publish(bus_name: str, items: list[Any]) -> list[int]:
        items = [(it[0], it[1], it[2] if len(it) > 2 else {}) for it in items]
        p = procs.spawn_python(PUBLISH_CODE, bus_name, stdin=subprocess.PIPE)
        out, err = p.communicate(json.dumps(items), timeout=60)
        assert p.returncode == 0, err
        return json.loads(out)  # type: ignore[no-any-return]

    return publish


@pytest.fixture
def sse() -> Iterator[Callable[..., SSEClient]]:
    made: list[SSEClient] = []

    def open_(url: str, params: Any = None, headers: dict[str, str] | None = None) -> SSEClient:
        c = SSEClient(url, params, headers)
        made.append(c)
        return c

    yield open_
    for c in made:
        c.close()
