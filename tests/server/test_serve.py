"""``serve()``, the lean server's loop: what it sets for the process while it runs."""

from __future__ import annotations

import asyncio
import socket
import sys
from typing import Any

from shmbus.adapters.server.serve import SWITCH_INTERVAL, serve

from .rig import in_loop


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers nothing (no request is made here); ignores the lifespan."""


@in_loop
async def test_the_switch_interval_is_short_while_the_server_serves() -> None:
    """While ``serve()`` runs, a thread waits at most SWITCH_INTERVAL for the GIL held by the loop thread (the bus
    listener, while a broadcast's writes run: what a chat message waited, 5 ms by default); the interval the
    process had comes back when the server stops."""
    before = sys.getswitchinterval()
    assert before > SWITCH_INTERVAL, "the test needs CPython's default (5 ms), or any longer interval"
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    stop = asyncio.Event()
    seen: list[float] = []
    task = asyncio.create_task(
        serve(_app, [sock], stop=stop, heartbeat=lambda: seen.append(sys.getswitchinterval()), heartbeat_interval=0.05)
    )
    try:
        while not seen:
            await asyncio.sleep(0.01)
        assert seen[0] == SWITCH_INTERVAL
    finally:
        stop.set()
        await task
        sock.close()
    assert sys.getswitchinterval() == before
