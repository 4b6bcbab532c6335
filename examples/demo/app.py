"""shmbus demo: a multi-worker chat and live dashboard (Falcon ASGI, served by gunicorn + UvicornWorker).

Run it with ``scripts/demo`` (``--host``/``--port``/``--workers``/``--bus``). By hand::

    SHMBUS_DEMO_BUS=demo gunicorn -c python:shmbus.adapters.integrations.gunicorn -k uvicorn.workers.UvicornWorker \\
        -w 2 -b 127.0.0.1:8000 --chdir examples/demo app:app

Every worker process attaches to the same shared-memory bus by name. A chat message POSTed to ``/chat`` is
published by whichever worker accepted that connection (the reply says which pid; the reply closes the
connection, so successive posts spread over the workers) and reaches every browser through whichever worker
holds its poll. Each worker also publishes its own figures to ``/dashboard/workers`` every 2 s. The dashboard
subscribes to ``/dashboard/clicks``, which the Spark example pipeline (``examples/spark_pipeline``,
docs/spark.md) fills from the ``/events/clicks`` this page's click buttons publish. With the ``[push]`` extra, the
page's "notify me" button subscribes the browser to Web Push notifications of new chat messages (``notify.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import os
import time
from pathlib import Path
from typing import Any

import falcon
import falcon.asgi
import notify

from shmbus import Bus
from shmbus.adapters.admin import AdminApp
from shmbus.adapters.guble import GubleApp
from shmbus.adapters.integrations.falcon import mount
from shmbus.adapters.metrics import MetricsApp

STATIC = Path(__file__).resolve().parent / "static"
STATIC_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".md": "text/plain; charset=utf-8",
    ".svg": "image/svg+xml",
}
CHAT = "/chat"
CLICKS = "/events/clicks"  # the Spark example's input channel
WORKERS = "/dashboard/workers"
MAX_TEXT = 500

# Same sizes as examples/spark_pipeline/generate_events.py: whichever starts first creates the segment.
bus = Bus(os.environ.get("SHMBUS_DEMO_BUS", "demo"), ring_size=64 << 20, max_backlog_size=100_000, create=True)
stats = {"requests": 0, "chats": 0, "clicks": 0, "started": time.time()}


def _text(value: Any, limit: int) -> str:
    return str(value or "").strip()[:limit]


async def _form(req: falcon.asgi.Request) -> dict[str, Any]:
    """JSON or form body as a dict (the page sends JSON; curl users may send a form)."""
    raw = await req.stream.read(16 * 1024)
    if (req.content_type or "").startswith("application/json"):
        try:
            obj = json.loads(raw or b"{}")
        except ValueError:
            raise falcon.HTTPBadRequest(description="malformed JSON")
        if not isinstance(obj, dict):
            raise falcon.HTTPBadRequest(description="expected a JSON object")
        return obj
    from urllib.parse import parse_qsl

    return dict(parse_qsl(raw.decode("utf-8", "replace")))


class Counter:
    """Falcon middleware: count requests per worker (for the dashboard)."""

    async def process_request(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        stats["requests"] += 1


class Lifespan:
    """Per worker: publish this worker's figures to ``/dashboard/workers`` every 2 s while it runs."""

    def __init__(self) -> None:
        self.task: asyncio.Task[None] | None = None

    async def process_startup(self, scope: Any, event: Any) -> None:
        self.task = asyncio.get_running_loop().create_task(self._report())

    async def process_shutdown(self, scope: Any, event: Any) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    async def _report(self) -> None:
        while True:
            # every client this worker holds: parked long polls, and streams (the npm client's default mode,
            # guble's WebSockets); the same figures `shmbus top` and /admin show
            held = bus.metrics.gauges()
            bus.publish(
                WORKERS,
                {
                    "pid": os.getpid(),
                    "parked": held.get("parked", 0),
                    "streams": held.get("streams", 0),
                    "at": time.time(),
                    **{k: stats[k] for k in ("requests", "chats", "clicks")},
                },
                max_backlog_size=50,
            )
            await asyncio.sleep(2.0)


class Page:
    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.content_type = STATIC_TYPES[".html"]
        # the page's commands name the bus this demo runs on (scripts/demo --bus NAME), not always "demo"
        resp.data = (STATIC / "index.html").read_bytes().replace(b"{{bus}}", html.escape(bus.name).encode())


class Favicon:
    """``/favicon.ico``: browsers ask for it on every page; the demo's icon (an SVG) instead of a 404."""

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.content_type = "image/svg+xml"
        resp.data = (STATIC / "favicon.svg").read_bytes()
        resp.cache_control = ["max-age=86400"]


class ServiceWorker:
    """``/sw.js``, at the root: a service worker receives pushes for the pages below its own path."""

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.content_type = STATIC_TYPES[".js"]
        resp.data = (STATIC / "sw.js").read_bytes()
        resp.cache_control = ["no-cache"]


class Static:
    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, name: str) -> None:
        path = (STATIC / name).resolve()
        if path.parent != STATIC or path.suffix not in STATIC_TYPES or not path.is_file():
            raise falcon.HTTPNotFound()
        resp.content_type = STATIC_TYPES[path.suffix]
        resp.data = path.read_bytes()
        resp.cache_control = ["no-cache"]


class Chat:
    """POST {"user", "text"}: publish on ``/chat`` from this worker; reply with the id and this worker's pid."""

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        body = await _form(req)
        text = _text(body.get("text"), MAX_TEXT)
        if not text:
            raise falcon.HTTPBadRequest(description="empty message")
        msg = {"user": _text(body.get("user"), 40) or "anonymous", "text": text, "pid": os.getpid(), "at": time.time()}
        mid = bus.publish(CHAT, msg, max_backlog_size=200)
        stats["chats"] += 1
        resp.media = {"id": mid, "pid": os.getpid()}
        resp.set_header("Connection", "close")  # the next post may land on another worker


class Click:
    """POST {"page", "user"}: one event on ``/events/clicks`` (the Spark example pipeline's input)."""

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        body = await _form(req)
        event = {
            "page": _text(body.get("page"), 80) or "/",
            "user": _text(body.get("user"), 40) or "anonymous",
            "ts": time.time(),
        }
        mid = bus.publish(CLICKS, event, max_backlog_size=bus.max_backlog_size)
        stats["clicks"] += 1
        resp.media = {"id": mid, "pid": os.getpid()}


class WhoAmI:
    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.media = {"pid": os.getpid(), "bus": bus.name}


api = falcon.asgi.App(middleware=[Counter(), Lifespan()])
api.add_route("/", Page())
api.add_route("/static/{name}", Static())
api.add_route("/favicon.ico", Favicon())
api.add_route("/chat", Chat())
api.add_route("/click", Click())
api.add_route("/whoami", WhoAmI())
api.add_route("/sw.js", ServiceWorker())

# The message bus answers /message-bus/... before Falcon sees the request. Streaming and long polls park as
# coroutines (no thread each); 10,000 per worker is far below what a worker can hold.
app = mount(api, bus=bus, max_active_clients=10_000)


def _guble_user(scope: Any) -> str | None:
    """The demo has no login: guble's URL form ``/stream/user/<name>`` names the user. A real app takes the user
    from its session, never from the URL."""
    path: str = scope.get("path") or ""
    name = path[len("/stream/user/") :].split("/", 1)[0] if path.startswith("/stream/user/") else ""
    return name[:40] or None


# guble's WebSocket protocol at /stream/ (try it: `shmbus guble --url ws://127.0.0.1:8000/stream/ --user alice`);
# sends are allowed under /guble/ only, so guble clients cannot write into the chat's or the dashboard's channels.
app = GubleApp(app, bus=bus, user_id_lookup=_guble_user, allow_send=lambda scope, path: path.startswith("/guble/"))

# "notify me": Web Push of new chat messages (/push/ routes, one elected sender); skipped without the [push] extra.
app, push = notify.wrap(app, bus, CHAT)


def _local_admin(scope: Any) -> bool:
    """The demo has no login: a browser on this machine is the admin (the demo binds 127.0.0.1 by default).
    A real app asks its session, e.g. ``lambda scope: scope["user"].is_staff``."""
    client = scope.get("client") or ("", 0)
    return client[0] in ("127.0.0.1", "::1")


# The live admin page at /admin (plots of every worker, ring, lag, busiest channels, a tail of /chat) and the
# Prometheus metrics at /metrics: both read the host-wide figures from the segment, so any worker answers.
app = AdminApp(app, bus=bus, is_admin_lookup=_local_admin, tail="/chat", panels={"push": push.stats} if push else None)
app = MetricsApp(app, bus=bus, allow=_local_admin, extra=[push.metric_families] if push else [])
