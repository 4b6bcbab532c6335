"""The app behind the shared-client browser tests (``test_shared_client.py``): ``app`` (WSGI, for gunicorn
``gevent``) and ``asgi_app`` (for gunicorn ``uvicorn.workers.UvicornWorker``) serve the same routes.

Environment: ``SHMBUS_TEST_BUS`` (bus name), ``SHMBUS_E2E_LOG`` (a file; one JSON line per poll, appended by
every worker when a poll starts and when it ends). Routes:

* ``GET /tab?no=worker|worker,leader&npm=1&shared=0`` -> a page that loads ``message-bus.js`` and
  ``message-bus-ajax.js`` (``npm=1``) and then ``message-bus-shared.js`` (unless ``shared=0``), all from the
  middleware's asset route, after hiding ``SharedWorker`` (``no=worker``) and Web Locks (``no=...,leader``);
  ``window.T`` subscribes and records what arrived;
* ``/message-bus/...`` -> the middleware (``user_id_lookup``: the ``user`` cookie; long polls of
  ``SHMBUS_E2E_LONG_POLL`` s, 3 by default), wrapped by a logger that records per poll the client id, worker
  pid, user, and when it began and when its last piece was handed to the server (``time.monotonic``, one clock
  for every process of the host): how many polls the browser held at once, counted on the server.
"""

from __future__ import annotations

import json
import os
import time
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qs

from shmbus import Bus
from shmbus.adapters.asgi import MessageBusMiddleware as AsgiMiddleware
from shmbus.adapters.asgi_support import lifespan
from shmbus.adapters.wsgi import MessageBusMiddleware

bus = Bus(os.environ["SHMBUS_TEST_BUS"], keepalive_interval=0, create=True)
LOG = os.environ["SHMBUS_E2E_LOG"]

PAGE_HELPER = """
window.T = {
  got: {},
  at: {},
  sub: function (ch, lastId) {
    MessageBus.subscribe(ch, function (data, gid, id) {
      (T.got[ch] = T.got[ch] || []).push([id, data]);
      (T.at[ch] = T.at[ch] || []).push(Date.now());
    }, lastId);
    return true;
  },
  n: function (ch) { return (T.got[ch] || []).length; },
};
"""


def user_of(environ: dict[str, Any]) -> str | None:
    cookie = SimpleCookie(environ.get("HTTP_COOKIE", ""))
    return cookie["user"].value if "user" in cookie else None


def asgi_user_of(scope: dict[str, Any]) -> str | None:
    cookies = b"; ".join(v for k, v in scope.get("headers") or () if k == b"cookie").decode("latin-1")
    return user_of({"HTTP_COOKIE": cookies})


def page(query: str) -> bytes:
    q = parse_qs(query)
    no = set((q.get("no") or [""])[0].split(","))
    head = ['<!doctype html><meta charset=utf-8><title>shmbus tab</title><link rel=icon href="data:,">', "<script>"]
    if "worker" in no:
        head.append("delete window.SharedWorker;")
    if "leader" in no:
        head.append("Object.defineProperty(Navigator.prototype, 'locks', {get: function () { return undefined; }});")
    head.append("</script>")
    if (q.get("npm") or ["0"])[0] == "1":
        head.append('<script src="/message-bus/assets/message-bus.js"></script>')
        head.append('<script src="/message-bus/assets/message-bus-ajax.js"></script>')
    if (q.get("shared") or ["1"])[0] == "1":
        head.append('<script src="/message-bus/assets/message-bus-shared.js"></script>')
    head.append(f"<script>{PAGE_HELPER}</script>")
    return "\n".join(head).encode()


def _inner(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    if environ.get("PATH_INFO") == "/tab":
        body = page(environ.get("QUERY_STRING", ""))
        start_response("200 OK", [("content-type", "text/html; charset=utf-8"), ("content-length", str(len(body)))])
        return [body]
    start_response("404 Not Found", [("content-type", "text/plain"), ("content-length", "9")])
    return [b"not found"]


LONG_POLL = float(os.environ.get("SHMBUS_E2E_LONG_POLL", "3"))
_mb = MessageBusMiddleware(_inner, bus=bus, user_id_lookup=user_of, long_polling_interval=LONG_POLL)


def write(entry: dict[str, Any]) -> None:
    with open(LOG, "a") as f:  # O_APPEND: lines from different workers stay whole
        f.write(json.dumps(entry) + "\n")


def begin(path: str, user: str | None) -> dict[str, Any]:
    """A poll's log entry, its start written now."""
    entry = {"kind": "poll", "pid": os.getpid(), "cid": path.split("/")[2], "user": user}
    entry["t0"] = entry["t1"] = time.monotonic()
    entry["key"] = f"{os.getpid()}-{entry['t0']}"
    write({"kind": "start", "key": entry["key"], "user": user})
    return entry


def is_poll(path: str) -> bool:
    return path.startswith("/message-bus/") and path.endswith("/poll")


def app(environ: dict[str, Any], start_response: Any) -> Any:
    path = environ.get("PATH_INFO", "")
    if not is_poll(path):
        return _mb(environ, start_response)
    entry = begin(path, user_of(environ))

    def body() -> Any:
        try:
            for piece in _mb(environ, start_response):
                # before the piece goes out: a browser that starts its next poll after this one ended starts
                # it after this time, so a hand-over never counts as two polls at once
                entry["t1"] = time.monotonic()
                yield piece
        finally:
            write(entry)

    return body()


# ---------------------------------------------------------------------------------------------------- ASGI
async def _asgi_inner(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
        return
    if scope["path"] == "/tab":
        status, body, ctype = 200, page(scope.get("query_string", b"").decode()), b"text/html; charset=utf-8"
    else:
        status, body, ctype = 404, b"not found", b"text/plain"
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", ctype)]})
    await send({"type": "http.response.body", "body": body})


_asgi_mb = AsgiMiddleware(_asgi_inner, bus=bus, user_id_lookup=asgi_user_of, long_polling_interval=LONG_POLL)


async def asgi_app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http" or not is_poll(scope["path"]):
        await _asgi_mb(scope, receive, send)
        return
    entry = begin(scope["path"], asgi_user_of(scope))

    async def logging_send(message: Any) -> None:
        if message["type"] == "http.response.body":
            entry["t1"] = time.monotonic()  # before the piece goes out (see app)
        await send(message)

    try:
        await _asgi_mb(scope, receive, logging_send)
    finally:
        write(entry)
