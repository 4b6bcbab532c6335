"""The WSGI and ASGI entry points: Django's application with the message_bus routes in front of it.

``wsgi.py``::

    from shmbus.adapters.integrations.django import get_wsgi_application
    application = get_wsgi_application()

``asgi.py``: the same with ``get_asgi_application``. Both serve ``<base_route>message-bus/`` from the
middleware of :mod:`shmbus.adapters.wsgi` / :mod:`shmbus.adapters.asgi` with the options of ``settings.SHMBUS``
and the Django lookups of :mod:`.lookups`; every other path goes to Django unchanged. Bus requests never reach
Django's middleware: no view, no CSRF check (polls change nothing: see docs/django.md), no session save.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .checks import gunicorn_worker, startup_checks
from .conf import LOOKUP_KEYS
from .lookups import asgi_lookup, asgi_subscribe_check, wsgi_lookup, wsgi_subscribe_check
from .runtime import bus_settings, get_bus

__all__ = ["get_asgi_application", "get_wsgi_application", "middleware_options"]


Wrap = Callable[[Callable[..., Any]], Callable[..., Any]]


def middleware_options(wrap: Wrap, wrap_check: Wrap | None = None) -> dict[str, Any]:
    """``SHMBUS['MIDDLEWARE']`` plus the lookups, each wrapped by ``wrap`` for its shell (``SUBSCRIBE_ALLOWED`` by
    ``wrap_check``: it is called ``(info, channel)``, not with the environ or scope)."""
    conf = bus_settings()
    options = dict(conf.middleware)
    for key, option in LOOKUP_KEYS.items():
        fn = conf.lookup(key)
        if fn is not None:
            options[option] = (wrap_check or wrap)(fn) if option == "subscribe_allowed" else wrap(fn)
    return options


def get_wsgi_application(application: Callable[..., Any] | None = None) -> Any:
    """Django's WSGI application (or ``application``, e.g. one wrapped by WhiteNoise) behind the bus routes."""
    from django.core.wsgi import get_wsgi_application as django_wsgi

    from shmbus.adapters.wsgi import MessageBusMiddleware

    worker = gunicorn_worker()
    app = application if application is not None else django_wsgi()
    startup_checks(worker)
    return MessageBusMiddleware(app, bus=get_bus(), **middleware_options(wsgi_lookup, wsgi_subscribe_check))


def get_asgi_application(application: Callable[..., Any] | None = None) -> Any:
    """Django's ASGI application (or ``application``) behind the bus routes."""
    from django.core.asgi import get_asgi_application as django_asgi

    from shmbus.adapters.asgi import MessageBusMiddleware

    worker = gunicorn_worker()
    app = application if application is not None else django_asgi()
    startup_checks(worker)
    return MessageBusMiddleware(app, bus=get_bus(), **middleware_options(asgi_lookup, asgi_subscribe_check))
