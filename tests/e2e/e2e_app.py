"""The app behind the browser tests: the real npm client's page, a publish route, and a request log.

Environment: ``SHMBUS_TEST_BUS`` (bus name), ``SHMBUS_E2E_LOG`` (a file; one JSON line per message-bus poll and
per publish, appended by every worker). ``asgi_app`` (gunicorn ``uvicorn.workers.UvicornWorker``) and
``wsgi_app`` (gunicorn ``gevent``) serve the same routes:

* ``GET /page`` -> ``page.html``; ``GET /assets-page`` -> ``assets_page.html`` (only the middleware's assets);
  ``GET /refused-page`` -> ``refused_page.html`` (``subscribe_allowed`` refuses every channel under ``/private``);
  ``GET /mb.js`` -> ``message-bus.js`` of the npm package ``scripts/test``
  installed; ``GET /mb-ajax.js`` -> shmbus's XHR adapter;
* ``POST /publish?ch=C&i=N`` -> publishes ``{"i": N, "pid": <this worker>}`` on ``C``; the reply
  (``{"id","gid","pid"}``) closes the connection, so the browser's next publish may reach the other worker;
* ``/message-bus/...`` -> the middleware, wrapped by a logger that records, per poll, the worker pid, query,
  ``Dont-Chunk``, response content type, the ``global_id``\\ s it carried, and start/end (``time.monotonic``,
  one clock for every process of the host), so the test can tell how each message was delivered.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from shmbus import Bus
from shmbus.adapters.asgi import MessageBusMiddleware as AsgiMiddleware
from shmbus.adapters.asgi_support import lifespan
from shmbus.adapters.wsgi import MessageBusMiddleware as WsgiMiddleware

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
FILES = {
    "/page": (HERE / "page.html", "text/html; charset=utf-8"),
    "/assets-page": (HERE / "assets_page.html", "text/html; charset=utf-8"),
    "/refused-page": (HERE / "refused_page.html", "text/html; charset=utf-8"),
    "/mb.js": (HERE / "node_modules" / "message-bus-client" / "assets" / "message-bus.js", "text/javascript"),
    "/mb-ajax.js": (REPO / "adapters" / "http" / "static" / "message-bus-ajax.js", "text/javascript"),
}
GID_RE = re.compile(rb'"global_id":(\d+)')

bus = Bus(os.environ["SHMBUS_TEST_BUS"], keepalive_interval=0, create=True)
LOG = os.environ["SHMBUS_E2E_LOG"]


def may_subscribe(info: Any, channel: str) -> bool:
    """The middleware's ``subscribe_allowed``: nobody may read a channel under ``/private``."""
    return not channel.startswith("/private")


def log(entry: dict[str, Any]) -> None:
    """One line per event; O_APPEND keeps lines from different workers whole."""
    with open(LOG, "a") as f:
        f.write(json.dumps(entry) + "\n")


def _blocking_sleep(seconds: float) -> None:
    """time.sleep that blocks the whole worker, also under gevent's monkey patching."""
    monkey = sys.modules.get("gevent.monkey")
    sleep = monkey.get_original("time", "sleep") if monkey is not None else time.sleep
    sleep(seconds)


def publish(query: str) -> tuple[int, bytes]:
    q = parse_qs(query)
    try:
        ch, i = q["ch"][0], int(q["i"][0])
    except (KeyError, ValueError):
        return 400, b"need ch and i"
    mid = bus.publish(ch, {"i": i, "pid": os.getpid()})
    gid = bus.backlog(ch, (mid or 1) - 1)[0].global_id
    log({"kind": "publish", "pid": os.getpid(), "i": i, "id": mid, "gid": gid, "t": time.monotonic()})
    # Keep this worker busy for a moment (blocking, even on the event loop) so that the page's concurrent
    # publishes are accepted by the other worker: an idle kernel hands a lone worker every connection.
    _blocking_sleep(0.02)
    return 200, json.dumps({"id": mid, "gid": gid, "pid": os.getpid()}).encode()


def poll_entry(query: str, dont_chunk: bool, t0: float) -> dict[str, Any]:
    return {
        "kind": "poll",
        "pid": os.getpid(),
        "query": query,
        "dont_chunk": dont_chunk,
        "t0": t0,
        "status": None,
        "ctype": None,
        "gids": [],
        "writes": 0,
    }


def _note_body(entry: dict[str, Any], body: bytes) -> None:
    if body:
        entry["writes"] += 1
        entry["gids"] += [int(g) for g in GID_RE.findall(body)]


# ---------------------------------------------------------------------------------------------------- ASGI
async def _asgi_inner(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
        return
    path = scope["path"]
    headers = [(b"content-type", b"text/plain")]
    if path in FILES:
        file, ctype = FILES[path]
        status, body, headers = 200, file.read_bytes(), [(b"content-type", ctype.encode())]
    elif path == "/publish":
        status, body = publish(scope.get("query_string", b"").decode())
        headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
    else:
        status, body = 404, b"not found"
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


_asgi_mb = AsgiMiddleware(_asgi_inner, bus=bus, subscribe_allowed=may_subscribe)


async def asgi_app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http" or not scope["path"].startswith("/message-bus/"):
        await _asgi_mb(scope, receive, send)
        return
    entry = poll_entry(
        scope.get("query_string", b"").decode(),
        any(k == b"dont-chunk" for k, _ in scope.get("headers") or ()),
        time.monotonic(),
    )

    async def logging_send(message: Any) -> None:
        if message["type"] == "http.response.start":
            entry["status"] = message["status"]
            entry["ctype"] = dict(message.get("headers") or ()).get(b"content-type", b"").decode()
        elif message["type"] == "http.response.body":
            _note_body(entry, message.get("body", b""))
        await send(message)

    try:
        await _asgi_mb(scope, receive, logging_send)
    finally:
        entry["t1"] = time.monotonic()
        log(entry)


# ---------------------------------------------------------------------------------------------------- WSGI
def _wsgi_inner(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    path = environ.get("PATH_INFO", "")
    if path in FILES:
        file, ctype = FILES[path]
        body = file.read_bytes()
        start_response("200 OK", [("content-type", ctype), ("content-length", str(len(body)))])
        return [body]
    if path == "/publish":
        status, body = publish(environ.get("QUERY_STRING", ""))
        start_response(
            f"{status} X",
            [("content-type", "application/json"), ("connection", "close"), ("content-length", str(len(body)))],
        )
        return [body]
    start_response("404 Not Found", [("content-type", "text/plain"), ("content-length", "9")])
    return [b"not found"]


_wsgi_mb = WsgiMiddleware(_wsgi_inner, bus=bus, subscribe_allowed=may_subscribe)


def wsgi_app(environ: dict[str, Any], start_response: Any) -> Any:
    if not environ.get("PATH_INFO", "").startswith("/message-bus/"):
        return _wsgi_mb(environ, start_response)
    entry = poll_entry(environ.get("QUERY_STRING", ""), "HTTP_DONT_CHUNK" in environ, time.monotonic())

    def logging_start(status: str, headers: list[tuple[str, str]], *exc: Any) -> Any:
        entry["status"] = int(status.split(" ", 1)[0])
        entry["ctype"] = dict((k.lower(), v) for k, v in headers).get("content-type")
        return start_response(status, headers, *exc)

    def body() -> Any:
        try:
            for piece in _wsgi_mb(environ, logging_start):
                _note_body(entry, piece)
                yield piece
        finally:
            entry["t1"] = time.monotonic()
            log(entry)

    return body()
