"""The app behind tests/e2e/test_presence_browser.py: the npm client's page and the middleware with presence on.

Environment: ``SHMBUS_TEST_BUS`` (bus name), ``SHMBUS_E2E_LPI`` (the long-polling interval, seconds). Served by
gunicorn's ``gevent`` workers: ``GET /presence-page`` -> ``presence_page.html``, ``/mb.js`` and ``/mb-ajax.js``
as in e2e_app.py, and the middleware (``presence=True``, ``presence_grace=1``, ``subscribe_allowed`` refusing
every channel under ``/private``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from shmbus import Bus
from shmbus.adapters.wsgi import MessageBusMiddleware

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
FILES = {
    "/presence-page": (HERE / "presence_page.html", "text/html; charset=utf-8"),
    "/mb.js": (HERE / "node_modules" / "message-bus-client" / "assets" / "message-bus.js", "text/javascript"),
    "/mb-ajax.js": (REPO / "adapters" / "http" / "static" / "message-bus-ajax.js", "text/javascript"),
}

bus = Bus(os.environ["SHMBUS_TEST_BUS"], keepalive_interval=0, create=True)


def may_subscribe(info: Any, channel: str) -> bool:
    return not channel.startswith("/private")


def _files(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    path = environ.get("PATH_INFO", "")
    if path in FILES:
        file, ctype = FILES[path]
        body = file.read_bytes()
        start_response("200 OK", [("content-type", ctype), ("content-length", str(len(body)))])
        return [body]
    start_response("404 Not Found", [("content-type", "text/plain"), ("content-length", "9")])
    return [b"not found"]


app = MessageBusMiddleware(
    _files,
    bus=bus,
    subscribe_allowed=may_subscribe,
    presence=True,
    presence_grace=1,
    long_polling_interval=float(os.environ.get("SHMBUS_E2E_LPI", "2")),
)
