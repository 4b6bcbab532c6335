"""What the SSE and WebSocket apps share (:class:`TransportApp`): their options, this process's :class:`Hub`, the
:class:`Connection` their hooks see and the hooks' calls."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from shmbus.bus import Bus

from ..asgi_support import Scope, maybe_await
from ..http.options import bus_or_default
from .connection import Connection, check_hooks
from .hub import Hub, loop_runner
from .identity import LookupOptions
from .sink import Sink

log = logging.getLogger(__name__)


class TransportApp:
    """What the SSE and WebSocket apps share: the bus (default :func:`shmbus.default_bus`), the wrapped app, the
    route, the buffer and subscription limits, the lookups, this process's :class:`Hub` and the drop count."""

    def __init__(
        self,
        app: Callable[..., Any] | None,
        bus: Bus | None,
        path: str,
        max_buffer: int,
        max_subscriptions: int,
        lookups: LookupOptions,
        on_open: Callable[[Connection], Any] | None = None,
        on_close: Callable[[Connection], Any] | None = None,
    ) -> None:
        check_hooks(on_open, on_close)
        self.on_open = on_open
        self.on_close = on_close
        self.app = app
        self.bus = bus = bus_or_default(bus)
        self.path = path
        self.max_buffer = max_buffer
        self.max_subscriptions = max_subscriptions
        self.lookups = lookups
        self.hub = Hub(bus)
        self.dropped = 0  # connections dropped for not reading (this process)

    def stats(self) -> dict[str, int]:
        return {"connections": self.hub.connections(), "dropped": self.dropped}

    def connection(self, sink: Sink, scope: Scope) -> Connection:
        """The :class:`Connection` the hooks see; its changes run on the current event loop."""
        return Connection(self.bus, sink, scope, loop_runner(asyncio.get_running_loop()), self.max_subscriptions)

    async def opened(self, conn: Connection) -> None:
        """Run ``on_open(conn)`` (plain or async); its exceptions propagate (the transport refuses the client)."""
        if self.on_open is not None:
            await maybe_await(self.on_open(conn))

    async def closed(self, conn: Connection) -> None:
        """End the connection's subscriptions, then run ``on_close(conn)``; never raises."""
        conn.close()
        if self.on_close is not None:
            try:
                await maybe_await(self.on_close(conn))
            except Exception:
                log.exception("shmbus: on_close hook %r failed", self.on_close)

    def close(self) -> None:
        self.hub.close()
