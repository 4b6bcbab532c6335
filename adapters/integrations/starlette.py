"""Starlette / FastAPI glue: ``install(app, bus=bus, **options)``.

A few lines for a user::

    from fastapi import FastAPI           # or starlette.applications.Starlette
    from shmbus import Bus
    from shmbus.adapters.integrations.starlette import install

    bus = Bus("myapp", create=True)
    app = FastAPI()
    install(app, bus=bus, user_id_lookup=lambda scope: scope.get("session", {}).get("user_id"),
            subscribe_allowed=lambda info, channel: not channel.startswith("/admin") or info.user_id == 1)

``install`` adds :class:`shmbus.adapters.asgi.MessageBusMiddleware` with ``app.add_middleware``. Starlette makes
the most recently added middleware the outermost, so call ``install`` **after** your other ``add_middleware``
calls: bus requests then skip routing, sessions and every other middleware, and polls never re-send a session
cookie (Starlette's ``SessionMiddleware`` re-sends a non-empty session's cookie on every response it wraps).
Equivalent by hand: ``app = MessageBusMiddleware(app, bus=bus, ...)``. Lookups receive the ASGI scope and may be
``async``; a lookup that needs the session can read the cookie from ``starlette.requests.Request(scope)``.
Serve with ``uvicorn mymod:app`` or gunicorn's ``uvicorn.workers.UvicornWorker``.
"""

from __future__ import annotations

from typing import Any

from shmbus.bus import Bus

from ..asgi import MessageBusMiddleware
from ..http.subscribe import SubscribeAllowed

__all__ = ["MessageBusMiddleware", "install"]


def install(
    app: Any, *, bus: Bus | None = None, subscribe_allowed: SubscribeAllowed | None = None, **options: Any
) -> None:
    """Add the message bus middleware to a Starlette or FastAPI ``app``; ``subscribe_allowed(info, channel)``
    (plain or ``async``): :mod:`shmbus.adapters.http.subscribe`."""
    app.add_middleware(MessageBusMiddleware, bus=bus, subscribe_allowed=subscribe_allowed, **options)
