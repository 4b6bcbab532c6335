"""Apps served by gunicorn with ``shmbus.adapters.server.GunicornWorker`` in tests/server.

Environment: SHMBUS_TEST_BUS (bus name), SHMBUS_TEST_OPTS (JSON middleware options).

* ``mw_app``: ``MessageBusMiddleware(echo, ...)`` (detected by the worker and served natively);
* ``echo``: a plain ASGI app (bus options then come from ``shmbus_options`` in the gunicorn config);
  it answers ``/echo`` with what it received (JSON), ``/chunks?n=N`` with N body pieces and no
  content-length, ``/pid`` with the worker pid and ``/boom`` by raising.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from shmbus import Bus
from shmbus.adapters.asgi import MessageBusMiddleware
from shmbus.adapters.asgi_support import lifespan

bus = Bus(os.environ["SHMBUS_TEST_BUS"], keepalive_interval=0, create=True)
OPTS: dict[str, Any] = json.loads(os.environ.get("SHMBUS_TEST_OPTS") or "{}")
LIFESPAN: list[str] = []


async def echo(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await lifespan(receive, send, on_startup=lambda: LIFESPAN.append("startup"))
        return
    path = scope["path"]
    if path == "/boom":
        raise RuntimeError("boom")
    if path == "/badheader":  # header injection attempt: the server must refuse it (500), not send it
        await send({"type": "http.response.start", "status": 200, "headers": [(b"x-a", b"1\r\nx-injected: 1")]})
        await send({"type": "http.response.body", "body": b""})
        return
    if path == "/slowread":  # an app that reads its (large) body only after a while
        import asyncio

        await asyncio.sleep(3)
    if path == "/pid":
        body = str(os.getpid()).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})
        return
    if path == "/chunks":
        n = int(scope["query_string"].decode().partition("=")[2] or 3)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        for i in range(n):
            await send({"type": "http.response.body", "body": b"piece%d;" % i, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    pieces = 0
    parts = []
    while True:
        m = await receive()
        assert m["type"] == "http.request", m
        parts.append(m.get("body", b""))
        pieces += 1
        if not m.get("more_body"):
            break
    body = b"".join(parts)
    out = json.dumps(
        {
            "method": scope["method"],
            "path": scope["path"],
            "raw_path": scope["raw_path"].decode("latin-1"),
            "query": scope["query_string"].decode("latin-1"),
            "http_version": scope["http_version"],
            "headers": [[k.decode("latin-1"), v.decode("latin-1")] for k, v in scope["headers"]],
            "body_len": len(body),
            "body_sha": hashlib.sha256(body).hexdigest(),
            "body_head": body[:100].decode("latin-1"),
            "lifespan": LIFESPAN,
            "client": list(scope["client"] or ()),
            "pid": os.getpid(),
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 201,
            "headers": [
                (b"content-type", b"application/json"),
                (b"x-echo", b"yes"),
                (b"content-length", str(len(out)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": out})


def _headers_lookup(scope: Any) -> dict[str, str]:
    return {"access-control-allow-origin": "*"}


mw_app = MessageBusMiddleware(echo, bus=bus, extra_response_headers_lookup=_headers_lookup, **OPTS)
