"""Apps for the client-bound subscription tests (the iodine draft's client objects), as ASGI (``asgi_app``:
SSEApp + WebSocketApp, under uvicorn) and WSGI (``wsgi_app``: SSEWSGIApp in front of a Flask app, under gunicorn
gevent/gthread).

Every stream's ``on_open`` subscribes its connection server-side (the query names no channel)::

    /srv/direct, /srv/room/* (glob)           no callback: messages go straight to the client
    /srv/cb                                   callback: recorded in this process, not sent to the client
    /srv/swap1: callback, then direct         the direct one replaces the callback
    /srv/swap2: direct, then callback         the callback replaces the direct one
    /srv/user/<x-user>                        only when the x-user header is given

``GET /state`` reports the callback log, the closed connections (with ``open`` and what ``subscribe`` returned
after the close) and how many bus subscriptions the callbacks hold; ``GET /local?channel=..&data=..`` publishes
with ``engine=False`` (this process's clients only); ``GET /health``. Env: SHMBUS_TEST_BUS.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any
from urllib.parse import parse_qs

from flask import Flask
from flask import request as flask_request

from shmbus import Bus
from shmbus.adapters.asgi_support import lifespan
from shmbus.adapters.transports.connection import Connection
from shmbus.adapters.transports.sse import SSEApp
from shmbus.adapters.transports.sse_wsgi import SSEWSGIApp
from shmbus.adapters.transports.websocket import WebSocketApp

bus = Bus(os.environ["SHMBUS_TEST_BUS"], keepalive_interval=0, create=True)
_lock = threading.Lock()
CALLBACKS: list[list[Any]] = []
CLOSED: list[dict[str, Any]] = []
OPEN: list[Connection] = []


def on_open(conn: Connection) -> None:
    assert conn.pubsub_version == 0 and conn.open

    def record(channel: str, data: Any) -> None:
        with _lock:
            CALLBACKS.append([conn.client_id, channel, data])

    assert conn.subscribe("/srv/direct") is True
    assert conn.subscribe("/srv/room/*", pattern=True) is True
    assert conn.subscribe("/srv/cb", callback=record) is True
    conn.subscribe("/srv/swap1", callback=record)
    conn.subscribe("/srv/swap1")
    conn.subscribe("/srv/swap2")
    conn.subscribe("/srv/swap2", callback=record)
    if conn.user_id is not None:
        conn.subscribe(f"/srv/user/{conn.user_id}")
    with _lock:
        OPEN.append(conn)


def on_close(conn: Connection) -> None:
    after = conn.subscribe("/srv/late")  # the draft: nil on a known failure (the connection is closed)
    with _lock:
        CLOSED.append({"client_id": conn.client_id, "open": conn.open, "subscribe_after_close": after})
        if conn in OPEN:
            OPEN.remove(conn)


def state() -> bytes:
    with _lock:
        subs = sum(len(bus.subscriptions.on(ch)) for ch in ("/srv/cb", "/srv/swap1", "/srv/swap2"))
        return json.dumps(
            {"callbacks": CALLBACKS, "closed": CLOSED, "open": len(OPEN), "callback_subs": subs, "pid": os.getpid()}
        ).encode()


def local(query: str) -> bytes:
    q = parse_qs(query)
    result = bus.publish(q["channel"][0], q["data"][0], engine=False)
    return json.dumps({"result": result}).encode()


def _user(headers: dict[str, str]) -> int | None:
    v = headers.get("x-user")
    return int(v) if v else None


# ---------------------------------------------------------------------------------------------------- ASGI
def _asgi_user(scope: Any) -> int | None:
    return _user({k.decode().lower(): v.decode() for k, v in scope.get("headers") or ()})


async def inner(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
        return
    if scope["type"] != "http":
        await send({"type": "websocket.close", "code": 1000})
        return
    path = scope["path"]
    body = (
        state()
        if path == "/state"
        else local(scope["query_string"].decode())
        if path == "/local"
        else b"ok"
        if path == "/health"
        else None
    )
    status = 200 if body is not None else 404
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body or b"not found"})


HOOKS: dict[str, Any] = {"on_open": on_open, "on_close": on_close}
ws_app = WebSocketApp(inner, bus=bus, user_id_lookup=_asgi_user, **HOOKS)
asgi_app = SSEApp(ws_app, bus=bus, keepalive_interval=1, user_id_lookup=_asgi_user, **HOOKS)


# ---------------------------------------------------------------------------------------------------- WSGI
def _wsgi_user(environ: Any) -> int | None:
    return _user({"x-user": environ.get("HTTP_X_USER", "")})


flask_app = Flask("pubsub_apps")  # the WSGI side is a Flask app, as users would mount it


@flask_app.get("/state")
def flask_state() -> Any:
    return flask_app.response_class(state(), mimetype="application/json")


@flask_app.get("/local")
def flask_local() -> Any:
    return flask_app.response_class(local(flask_request.query_string.decode()), mimetype="application/json")


@flask_app.get("/health")
def flask_health() -> str:
    return "ok"


wsgi_app = SSEWSGIApp(flask_app.wsgi_app, bus=bus, keepalive_interval=1, user_id_lookup=_wsgi_user, **HOOKS)
