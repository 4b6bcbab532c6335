"""The app served by a real uvicorn in the transport tests: message_bus middleware + SSE + WebSocket + REST.

Environment: SHMBUS_TEST_BUS (bus name), SHMBUS_TEST_MAX_BUFFER (bytes), SHMBUS_TEST_KEEPALIVE (seconds).
Identity comes from headers (standing in for a session): ``x-user`` (int), ``x-groups`` (ints, comma separated),
``x-site``. REST publishing needs ``x-token: secret`` and refuses ``/private...``; WebSocket publishing is allowed
on ``/pub/...`` only.
"""

from __future__ import annotations

import json
import os
from typing import Any

from shmbus import Bus
from shmbus.adapters.asgi import MessageBusMiddleware
from shmbus.adapters.asgi_support import lifespan
from shmbus.adapters.transports.rest import AsgiRestPublish
from shmbus.adapters.transports.sse import SSEApp
from shmbus.adapters.transports.websocket import WebSocketApp

bus = Bus(os.environ["SHMBUS_TEST_BUS"], keepalive_interval=0, create=True)
MAX_BUFFER = int(os.environ.get("SHMBUS_TEST_MAX_BUFFER") or (1 << 20))
KEEPALIVE = float(os.environ.get("SHMBUS_TEST_KEEPALIVE") or 15)


def _header(scope: Any, name: bytes) -> str | None:
    for k, v in scope.get("headers") or ():
        if k.lower() == name:
            return str(v.decode("latin-1"))
    return None


def user_id(scope: Any) -> int | None:
    v = _header(scope, b"x-user")
    return int(v) if v else None


async def group_ids(scope: Any) -> list[int]:  # async on purpose: lookups may be coroutines
    v = _header(scope, b"x-groups")
    return [int(g) for g in v.split(",")] if v else []


def site_id(scope: Any) -> str | None:
    return _header(scope, b"x-site")


def authorize(scope: Any, channel: str) -> bool:
    return _header(scope, b"x-token") == "secret" and not channel.startswith("/private")


def allow_publish(scope: Any, channel: str) -> bool:
    return channel.startswith("/pub/")


LOOKUPS: dict[str, Any] = {"user_id_lookup": user_id, "group_ids_lookup": group_ids, "site_id_lookup": site_id}


async def inner(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
        return
    if scope["type"] != "http":
        await send({"type": "websocket.close", "code": 1000})
        return
    if scope["path"] == "/stats":
        body = json.dumps({"sse": sse_app.stats(), "ws": ws_app.stats(), "pid": os.getpid()}).encode()
    elif scope["path"] == "/health":
        body = b"ok"
    else:
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b"not found"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


rest_app = AsgiRestPublish(inner, bus=bus, authorize=authorize, prefix="/api/message/")
ws_app = WebSocketApp(rest_app, bus=bus, allow_publish=allow_publish, max_buffer=MAX_BUFFER, **LOOKUPS)
sse_app = SSEApp(ws_app, bus=bus, max_buffer=MAX_BUFFER, keepalive_interval=KEEPALIVE, **LOOKUPS)
app = MessageBusMiddleware(sse_app, bus=bus, **LOOKUPS)
