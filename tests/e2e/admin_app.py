"""The app behind the admin page tests: the message-bus middleware, the admin page and a load generator.

``SHMBUS_TEST_BUS`` names the bus. Routes: ``/login`` sets the ``admin=yes`` cookie (the test's
``is_admin_lookup``) and redirects to ``/admin/`` with the query passed on; ``POST /publish?n=N`` publishes N
messages on ``/load`` and one targeted message on ``/load`` (user 7 only), from whichever worker answers;
``/message-bus/...`` the middleware (the load's long polls park here); ``/metrics`` the Prometheus endpoint;
``/admin/...`` the page. ``asgi_app`` runs under gunicorn's uvicorn worker; ``wsgi_app`` (Flask-free plain WSGI)
under gthread.
"""

from __future__ import annotations

import json
import os
from typing import Any

from shmbus import Bus
from shmbus.adapters.admin import AdminApp, AdminWSGIApp
from shmbus.adapters.asgi import MessageBusMiddleware as AsgiMiddleware
from shmbus.adapters.metrics import MetricsApp, MetricsWSGIApp
from shmbus.adapters.wsgi import MessageBusMiddleware as WsgiMiddleware

bus = Bus(os.environ["SHMBUS_TEST_BUS"], keepalive_interval=0, create=True)


def publish(n: int) -> bytes:
    ids = [bus.publish("/load", {"i": i, "pid": os.getpid()}) for i in range(n)]
    bus.publish("/load", {"secret": "for user 7"}, user_ids=[7])
    return json.dumps({"pid": os.getpid(), "ids": ids}).encode()


def _cookie_admin(cookie: str) -> bool:
    return any(part.strip() == "admin=yes" for part in cookie.split(";"))


def is_admin_scope(scope: Any) -> bool:
    cookie = dict(scope.get("headers") or ()).get(b"cookie", b"").decode("latin-1")
    return _cookie_admin(cookie)


def is_admin_environ(environ: Any) -> bool:
    return _cookie_admin(environ.get("HTTP_COOKIE", ""))


async def _asgi_inner(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    path, query = scope["path"], scope.get("query_string", b"").decode()
    status, headers, body = route(scope["method"], path, query)
    await send(
        {"type": "http.response.start", "status": status, "headers": [(k.encode(), v.encode()) for k, v in headers]}
    )
    await send({"type": "http.response.body", "body": body})


def route(method: str, path: str, query: str) -> tuple[int, list[tuple[str, str]], bytes]:
    if path == "/login":
        return 302, [("set-cookie", "admin=yes; Path=/"), ("location", "/admin/?" + query)], b""
    if path == "/publish" and method == "POST":
        n = int(dict(p.split("=", 1) for p in query.split("&") if "=" in p).get("n", "1"))
        return 200, [("content-type", "application/json"), ("connection", "close")], publish(n)
    if path == "/health":
        return 200, [("content-type", "text/plain")], b"ok"
    return 404, [("content-type", "text/plain")], b"not found"


asgi_app = MetricsApp(
    AdminApp(AsgiMiddleware(_asgi_inner, bus=bus), bus=bus, is_admin_lookup=is_admin_scope, tail="/load"), bus=bus
)


def _wsgi_inner(environ: Any, start_response: Any) -> list[bytes]:
    status, headers, body = route(environ["REQUEST_METHOD"], environ["PATH_INFO"], environ.get("QUERY_STRING", ""))
    start_response(f"{status} X", headers)
    return [body]


wsgi_app = MetricsWSGIApp(
    AdminWSGIApp(WsgiMiddleware(_wsgi_inner, bus=bus), bus=bus, is_admin_lookup=is_admin_environ, tail="/load"),
    bus=bus,
)
