"""Small ASGI helpers shared by the middleware (:mod:`.asgi`), the transports, and the test and benchmark apps
(:func:`lifespan` is the one lifespan stub for an app with nothing to start)."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


async def maybe_await(value: Any) -> Any:
    """``value``, awaited first when it is awaitable (lookups may be plain or coroutine functions)."""
    if inspect.isawaitable(value):
        return await value
    return value


async def lifespan(receive: Receive, send: Send, on_startup: Callable[[], Any] | None = None) -> None:
    """Complete the ASGI lifespan protocol for an app that has nothing to start or stop (``on_startup()`` is
    called at startup, for an app that wants to know)."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            if on_startup is not None:
                on_startup()
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def until_disconnect(receive: Receive) -> None:
    """Return once the client is gone (``http.disconnect``, or the server's ``receive`` failed)."""
    try:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
    except Exception:  # the server's receive failed: treat as gone
        return
