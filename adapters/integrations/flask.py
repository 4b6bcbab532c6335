"""Flask glue: ``init_app(app, bus=bus, **options)`` serves the message bus from a Flask app.

A few lines for a user::

    from flask import Flask
    from shmbus import Bus
    from shmbus.adapters.integrations.flask import init_app, with_request_context

    bus = Bus("myapp", create=True)
    app = Flask(__name__)
    init_app(app, bus=bus,
             user_id_lookup=with_request_context(app, lambda: flask.session.get("user_id")),
             subscribe_allowed=lambda info, channel: not channel.startswith("/admin") or flask.session.get("admin"))

``init_app`` wraps ``app.wsgi_app`` in :class:`shmbus.adapters.wsgi.MessageBusMiddleware` (stored as
``app.extensions["shmbus"]``), so bus requests never run Flask's request handling: no ``before_request`` hooks,
and the session is never saved, so polls never re-send the session cookie. Lookups receive the WSGI environ;
:func:`with_request_context` wraps a zero-argument function so it runs inside a Flask request context built
from that environ (``flask.session``, ``flask.request``, ``flask_login.current_user`` work; nothing is saved).
``subscribe_allowed(info, channel) -> bool`` (may this request read ``channel``? :mod:`shmbus.adapters.http.subscribe`)
runs inside such a request context too, with ``info.request`` the environ and ``info.user_id`` etc. the lookups'
results.
See :mod:`shmbus.adapters.wsgi` for server models (threads, gevent, sync workers).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shmbus.bus import Bus

from ..http.subscribe import RequestInfo, SubscribeAllowed, check_subscribe_allowed
from ..wsgi import MessageBusMiddleware
from ..wsgi_support import Environ

__all__ = ["init_app", "with_request_context"]


def init_app(
    app: Any, *, bus: Bus | None = None, subscribe_allowed: SubscribeAllowed | None = None, **options: Any
) -> MessageBusMiddleware:
    """Serve ``<base_route>message-bus/`` from ``app``; return the middleware. ``subscribe_allowed`` is called
    inside a Flask request context built from the poll's environ."""
    if subscribe_allowed is not None:
        check_subscribe_allowed(subscribe_allowed)
        options["subscribe_allowed"] = _in_request_context(app, subscribe_allowed)
    mw = MessageBusMiddleware(app.wsgi_app, bus=bus, **options)
    app.wsgi_app = mw
    app.extensions["shmbus"] = mw
    return mw


def with_request_context(app: Any, fn: Callable[[], Any]) -> Callable[[dict[str, Any]], Any]:
    """Make a lookup ``environ -> fn()`` that runs ``fn`` inside ``app.request_context(environ)``."""

    def lookup(environ: Environ) -> Any:
        with app.request_context(environ):
            return fn()

    return lookup


def _in_request_context(app: Any, hook: SubscribeAllowed) -> SubscribeAllowed:
    def subscribe_allowed(info: RequestInfo, channel: str) -> Any:
        with app.request_context(info.request):
            return hook(info, channel)

    return subscribe_allowed
