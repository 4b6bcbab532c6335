"""The loop that serves an app on bound sockets (:func:`serve`): a :class:`Server`, its connections, a stop."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any

from .bus_routes import BusRoutes
from .connection import HttpConnection
from .limits import Limits
from .server import Server

__all__ = ["SWITCH_INTERVAL", "connection_factory", "serve"]

#: The interpreter's switch interval while :func:`serve` runs (seconds; CPython's default is 5 ms): how long the
#: bus listener thread may wait for the GIL while the loop thread runs a slice of a broadcast's writes, which is
#: what a message waits before it is even queued for the loop. Each ``send`` releases the GIL, but the loop thread
#: takes it back before the woken listener can; only the interval forces the hand-over.
SWITCH_INTERVAL = 0.0005


def connection_factory(srv: Server) -> Callable[[], HttpConnection]:
    """What ``loop.create_server`` calls per accepted socket: a connection of ``srv`` with the server's routes."""
    return functools.partial(HttpConnection, srv, BusRoutes(srv))


async def serve(
    app: Any,
    sockets: Sequence[socket.socket],
    *,
    options: dict[str, Any] | None = None,
    keepalive: float = 5.0,
    max_requests: int = 0,
    graceful_timeout: float = 5.0,
    stop: asyncio.Event | None = None,
    heartbeat: Callable[[], Any] | None = None,
    heartbeat_interval: float = 1.0,
    backlog: int = 2048,
    limits: Limits | None = None,
) -> None:
    """Serve ``app`` on already-bound listening ``sockets`` until ``stop`` is set (or ``max_requests``), with the
    interpreter's switch interval at most :data:`SWITCH_INTERVAL` meanwhile."""
    switch = sys.getswitchinterval()
    sys.setswitchinterval(min(switch, SWITCH_INTERVAL))
    try:
        await _serve(
            app,
            sockets,
            options=options,
            keepalive=keepalive,
            max_requests=max_requests,
            graceful_timeout=graceful_timeout,
            stop=stop,
            heartbeat=heartbeat,
            heartbeat_interval=heartbeat_interval,
            backlog=backlog,
            limits=limits,
        )
    finally:
        sys.setswitchinterval(switch)


async def _serve(
    app: Any,
    sockets: Sequence[socket.socket],
    *,
    options: dict[str, Any] | None,
    keepalive: float,
    max_requests: int,
    graceful_timeout: float,
    stop: asyncio.Event | None,
    heartbeat: Callable[[], Any] | None,
    heartbeat_interval: float,
    backlog: int,
    limits: Limits | None,
) -> None:
    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    srv = Server(
        app,
        loop,
        options=options,
        keepalive=keepalive,
        max_requests=max_requests,
        on_max_requests=stop.set,
        limits=limits,
    )
    await srv.startup()
    factory = connection_factory(srv)
    servers = [await loop.create_server(factory, sock=s, backlog=backlog) for s in sockets]
    try:
        while not stop.is_set():
            if heartbeat is not None:
                heartbeat()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), heartbeat_interval)
    finally:
        for s in servers:
            s.close()
        await srv.shutdown(graceful_timeout)
        if srv.mw is not None:
            srv.mw.close()
