"""One "host" of the two-host example: a Starlette app whose bus is bridged to Redis.

Each host has its own shared-memory bus (its own ``SHMBUS_NAME``); the :class:`RedisBridge` engine sends every
publish through Redis, and one process per host relays Redis's messages into that host's segment. So a message
published on host ``a`` reaches the browsers connected to host ``b``, with the same ids. Environment:
``SHMBUS_NAME`` (the host's bus), ``HOST_NAME`` (shown on the page), ``REDIS_URL``. ``run.py`` starts two.
"""

from __future__ import annotations

import os
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse
from starlette.routing import Route

from shmbus import Bus
from shmbus.adapters.integrations.starlette import install
from shmbus.adapters.redis import RedisBridge

PAGE = Path(__file__).resolve().parent / "index.html"
HOST = os.environ.get("HOST_NAME", "a")

bus = Bus(
    os.environ.get("SHMBUS_NAME", f"two-hosts-{HOST}"),
    engine=RedisBridge(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")),
    create=True,
)


async def page(request: Request) -> HTMLResponse:
    return HTMLResponse(PAGE.read_text().replace("{{host}}", HOST))


async def say(request: Request) -> JSONResponse:
    try:
        body = await request.json()  # {"text": ...}: JSON (Starlette's form parsing needs python-multipart)
    except ValueError:
        body = None
    text = str(body.get("text") or "").strip()[:500] if isinstance(body, dict) else ""
    if not text:
        return JSONResponse({"error": 'send {"text": "..."}'}, status_code=400)
    return JSONResponse({"id": bus.publish("/hosts/chat", {"text": text, "host": HOST, "pid": os.getpid()})})


app = Starlette(routes=[Route("/", page), Route("/say", say, methods=["POST"])])
install(app, bus=bus)  # last: bus requests skip every other middleware
