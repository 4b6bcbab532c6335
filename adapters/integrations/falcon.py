"""Falcon glue: serve the message bus in front of a Falcon app (WSGI ``falcon.App`` or ASGI ``falcon.asgi.App``).

A few lines for a user::

    import falcon
    from shmbus import Bus
    from shmbus.adapters.integrations.falcon import mount

    bus = Bus("myapp", create=True)
    api = falcon.App()                 # or falcon.asgi.App()
    api.add_route("/hello", Hello())
    app = mount(api, bus=bus, user_id_lookup=lambda env: env.get("REMOTE_USER"),
                subscribe_allowed=lambda info, channel: not channel.startswith("/admin") or info.user_id == "root")

``mount`` wraps the Falcon app in :class:`shmbus.adapters.wsgi.MessageBusMiddleware` or
:class:`shmbus.adapters.asgi.MessageBusMiddleware` (chosen from the app's type): bus routes never go through
Falcon's routing, middleware or session handling, so polls are fast and never re-send cookies. Lookups receive
the WSGI environ / ASGI scope; build a ``falcon.Request(env)`` inside a lookup if you need Falcon's parsing.
Serve the returned object (``gunicorn -c python:shmbus.adapters.integrations.gunicorn mymod:app`` or
``uvicorn mymod:app``).
"""

from __future__ import annotations

from typing import Any

from shmbus.bus import Bus

from ..http.subscribe import SubscribeAllowed

__all__ = ["is_asgi_app", "mount"]


def is_asgi_app(app: Any) -> bool:
    try:
        import falcon.asgi
    except ImportError:  # pragma: no cover - falcon without asgi support
        return False
    return isinstance(app, falcon.asgi.App)


def mount(
    app: Any, *, bus: Bus | None = None, subscribe_allowed: SubscribeAllowed | None = None, **options: Any
) -> Any:
    """Return ``app`` wrapped in the WSGI or ASGI message bus middleware (options as in the middleware;
    ``subscribe_allowed(info, channel)``: :mod:`shmbus.adapters.http.subscribe`, ``async`` on an ASGI app)."""
    if is_asgi_app(app):
        from ..asgi import MessageBusMiddleware as AsgiMiddleware

        return AsgiMiddleware(app, bus=bus, subscribe_allowed=subscribe_allowed, **options)
    from ..wsgi import MessageBusMiddleware as WsgiMiddleware

    return WsgiMiddleware(app, bus=bus, subscribe_allowed=subscribe_allowed, **options)
