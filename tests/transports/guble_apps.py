"""The guble endpoint as a real uvicorn serves it in tests/transports/test_guble.py.

WebSocket ``/stream/`` (UserId from the ``x-user`` header, ApplicationId from ``x-app``; sends refused on
``/private...``) and REST ``POST /api/message/<topic>`` (needs ``x-token: secret``, refused on ``/private...``).
Env: SHMBUS_TEST_BUS.
"""

from __future__ import annotations

import os
from typing import Any

from shmbus import Bus
from shmbus.adapters.asgi_support import lifespan
from shmbus.adapters.guble import GubleApp

bus = Bus(os.environ["SHMBUS_TEST_BUS"], keepalive_interval=0, create=True)


def _header(scope: Any, name: bytes) -> str | None:
    for k, v in scope.get("headers") or ():
        if k.lower() == name:
            return str(v.decode("latin-1"))
    return None


def authorize(scope: Any, channel: str) -> bool:
    return _header(scope, b"x-token") == "secret" and not channel.startswith("/private")


async def inner(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
        return
    status, body = (200, b"ok") if scope.get("path") == "/health" else (404, b"not found")
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": body})


app = GubleApp(
    inner,
    bus=bus,
    user_id_lookup=lambda scope: _header(scope, b"x-user"),
    application_id_lookup=lambda scope: _header(scope, b"x-app"),
    allow_send=lambda scope, path: not path.startswith("/private"),
    authorize=authorize,
)
