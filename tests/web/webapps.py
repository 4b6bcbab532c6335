"""Apps served by real gunicorn/uvicorn processes in the smoke tests.

Environment: SHMBUS_TEST_BUS (bus name, required), SHMBUS_TEST_OPTS (JSON middleware options; with
``"lookups_from_headers": true`` the user and group ids come from the X-User-Id and X-Group-Ids headers; with
``"refuse_prefix": "/x"`` subscribe_allowed refuses the channels starting with ``/x``).
"""

from __future__ import annotations

import json
import os
from typing import Any

from shmbus import Bus
from shmbus.adapters.asgi import MessageBusMiddleware as AsgiMiddleware
from shmbus.adapters.asgi_support import lifespan
from shmbus.adapters.wsgi import MessageBusMiddleware as WsgiMiddleware

bus = Bus(os.environ["SHMBUS_TEST_BUS"], keepalive_interval=0, create=True)
OPTS: dict[str, Any] = json.loads(os.environ.get("SHMBUS_TEST_OPTS") or "{}")


def _header(env: Any, name: str) -> str | None:
    """A request header from a WSGI environ or an ASGI scope."""
    if "headers" in env:
        wanted = name.lower().encode()
        return next((v.decode() for k, v in env["headers"] if k.lower() == wanted), None)
    value = env.get("HTTP_" + name.upper().replace("-", "_"))
    return None if value is None else str(value)


if OPTS.pop("lookups_from_headers", False):  # who is asking: X-User-Id and X-Group-Ids (comma-separated)
    OPTS["user_id_lookup"] = lambda env: int(_header(env, "x-user-id") or 0) or None
    OPTS["group_ids_lookup"] = lambda env: [int(g) for g in (_header(env, "x-group-ids") or "").split(",") if g]


_REFUSE = OPTS.pop("refuse_prefix", None)
if _REFUSE:  # subscribe_allowed refuses the channels starting with it
    OPTS["subscribe_allowed"] = lambda info, channel: not channel.startswith(_REFUSE)


def _headers_lookup(env: Any) -> dict[str, str]:
    return {"access-control-allow-origin": "*"}


def hello(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    start_response("200 OK", [("content-type", "text/plain"), ("content-length", "5")])
    return [b"hello"]


async def hello_asgi(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"hello"})


wsgi_app = WsgiMiddleware(hello, bus=bus, extra_response_headers_lookup=_headers_lookup, **OPTS)
asgi_app = AsgiMiddleware(hello_asgi, bus=bus, extra_response_headers_lookup=_headers_lookup, **OPTS)
