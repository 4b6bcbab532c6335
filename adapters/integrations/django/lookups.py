"""Lookups as Django users write them: functions of an ``HttpRequest`` whose ``session`` and ``user`` are set.

The message_bus routes are served in front of Django's middleware stack (polls never run views, middleware or
session saving), so the middleware's lookups receive a WSGI environ or an ASGI scope. :func:`wsgi_lookup` and
:func:`asgi_lookup` turn a ``fn(request)`` into such a lookup: they build one Django request per poll (shared
by every lookup of that poll), load the session from its cookie with ``SESSION_ENGINE`` and set ``request.user``
lazily, as ``SessionMiddleware`` and ``AuthenticationMiddleware`` would, but never save the session: a poll
never sends a ``Set-Cookie`` and never extends a session's expiry. Database connections a lookup opened are
closed afterwards as Django closes them after a request (``CONN_MAX_AGE``). :func:`wsgi_subscribe_check` and
:func:`asgi_subscribe_check` do the same for the ``SUBSCRIBE_ALLOWED`` permission function, which is called
``fn(info, channel)`` with the poll's ``RequestInfo`` whose ``request`` is that Django request.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import replace
from importlib import import_module
from typing import Any

from ...wsgi_support import Environ

__all__ = [
    "asgi_lookup",
    "asgi_subscribe_check",
    "authenticated_user_pk",
    "django_request",
    "user_group_ids",
    "wsgi_lookup",
    "wsgi_subscribe_check",
]

#: Where the Django request built for a poll is kept on its environ or scope.
REQUEST_KEY = "shmbus.django_request"


def authenticated_user_pk(request: Any) -> Any:
    """The default ``USER_ID_LOOKUP``: the logged-in user's primary key; None for anonymous visitors."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return None
    pk = user.pk
    return pk if isinstance(pk, (int, str)) else str(pk)


def user_group_ids(request: Any) -> list[Any] | None:
    """The default ``GROUP_IDS_LOOKUP``: the primary keys of the logged-in user's ``django.contrib.auth`` groups."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated or not hasattr(user, "groups"):
        return None
    return list(user.groups.values_list("pk", flat=True))


def _with_session_and_user(request: Any) -> Any:
    """Set ``request.session`` (loaded lazily from the cookie) and a lazy ``request.user``, if those apps run."""
    from django.apps import apps
    from django.conf import settings

    if apps.is_installed("django.contrib.sessions"):
        engine = import_module(settings.SESSION_ENGINE)
        request.session = engine.SessionStore(request.COOKIES.get(settings.SESSION_COOKIE_NAME))
        if apps.is_installed("django.contrib.auth"):
            from django.contrib.auth import get_user
            from django.utils.functional import SimpleLazyObject

            request.user = SimpleLazyObject(lambda: get_user(request))
    return request


def django_request(environ_or_scope: dict[str, Any]) -> Any:
    """The Django request for this poll's WSGI environ or ASGI scope (built once, then reused)."""
    request = environ_or_scope.get(REQUEST_KEY)
    if request is None:
        if "REQUEST_METHOD" in environ_or_scope:  # a WSGI environ
            from django.core.handlers.wsgi import WSGIRequest

            request = WSGIRequest(environ_or_scope)  # reads no body: the middleware has it already
        else:
            from django.core.handlers.asgi import ASGIRequest

            request = ASGIRequest(environ_or_scope, io.BytesIO())
        environ_or_scope[REQUEST_KEY] = _with_session_and_user(request)
    return request


def _call(fn: Callable[..., Any], environ_or_scope: dict[str, Any], *args: Any) -> Any:
    from django.db import close_old_connections

    try:
        return fn(django_request(environ_or_scope), *args)
    finally:
        close_old_connections()


def wsgi_lookup(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A middleware lookup ``environ -> fn(request)`` (``on_middleware_error``: ``(environ, exc)``)."""

    def lookup(environ: Environ, *args: Any) -> Any:
        return _call(fn, environ, *args)

    lookup.__qualname__ = f"wsgi_lookup({getattr(fn, '__qualname__', fn)!s})"
    return lookup


def asgi_lookup(fn: Callable[..., Any]) -> Callable[..., Any]:
    """An async middleware lookup ``scope -> fn(request)``, run in a worker thread (it may query the database:
    the session, the user, the groups). Not thread-sensitive: a lookup is one self-contained call that closes
    its connections, so polls need not queue for Django's single sync thread."""
    from asgiref.sync import sync_to_async

    call = sync_to_async(_call, thread_sensitive=False)

    async def lookup(scope: dict[str, Any], *args: Any) -> Any:
        return await call(fn, scope, *args)

    lookup.__qualname__ = f"asgi_lookup({getattr(fn, '__qualname__', fn)!s})"
    return lookup


def _with_django_request(fn: Callable[..., Any], info: Any) -> Callable[[Any, str], Any]:
    """``fn(info, channel)`` called as a lookup ``(request, channel)``: ``info.request`` becomes the Django one."""

    def ask(request: Any, channel: str) -> Any:
        return fn(replace(info, request=request), channel)

    return ask


def wsgi_subscribe_check(fn: Callable[..., Any]) -> Callable[[Any, str], Any]:
    """The middleware's ``subscribe_allowed`` for a permission function ``fn(info, channel)`` (WSGI)."""

    def subscribe_allowed(info: Any, channel: str) -> Any:
        return _call(_with_django_request(fn, info), info.request, channel)

    subscribe_allowed.__qualname__ = f"wsgi_subscribe_check({getattr(fn, '__qualname__', fn)!s})"
    return subscribe_allowed


def asgi_subscribe_check(fn: Callable[..., Any]) -> Callable[[Any, str], Any]:
    """:func:`wsgi_subscribe_check` for ASGI: run in a worker thread, as :func:`asgi_lookup`."""
    from asgiref.sync import sync_to_async

    call = sync_to_async(_call, thread_sensitive=False)

    async def subscribe_allowed(info: Any, channel: str) -> Any:
        return await call(_with_django_request(fn, info), info.request, channel)

    subscribe_allowed.__qualname__ = f"asgi_subscribe_check({getattr(fn, '__qualname__', fn)!s})"
    return subscribe_allowed
