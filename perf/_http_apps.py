"""Apps served by the HTTP benchmarks and tests/web_load (imported by the server processes only).

Environment: ``SHMBUS_LOAD_BUS`` (bus name), ``SHMBUS_LOAD_OPTS`` (JSON middleware options, e.g.
``{"max_active_clients": 20000, "long_polling_interval": 120}``).

* ``asgi_app`` / ``wsgi_app``: the shmbus middleware alone (404 elsewhere).
* ``native_app``: the same middleware object, built at import, for ``shmbus.adapters.server.GunicornWorker``
  (``gunicorn -k shmbus.adapters.server.GunicornWorker``), which serves the bus routes of a
  ``MessageBusMiddleware`` natively (a plain function would go through its ASGI bridge).
* ``ordinary_app``: an ordinary app: ``MessageBusMiddleware`` wrapping an ASGI app whose ``POST /publish`` route
  calls ``bus.publish`` (as a view would), with all four lookups set (user, groups, site, extra headers); the
  same object serves the lean worker natively. ``perf/gem_app.ru`` is the same app on the gem.
* ``bare_asgi``: the same-run baseline, no bus: answers any POST with the same headers and ``[]`` a ``dlp=t``
  poll gets (immediate polls), or with ``?hold=1`` sends the first streamed ``[]`` chunk and holds the request
  open until the client leaves (memory per held request of the server itself).
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from shmbus.adapters.asgi_support import lifespan

_mb: dict[str, Any] = {}


def _bus() -> Any:
    from shmbus import Bus

    if "bus" not in _mb:
        _mb["bus"] = Bus(os.environ["SHMBUS_LOAD_BUS"], keepalive_interval=0, create=True)
    return _mb["bus"]


def _opts() -> dict[str, Any]:
    return dict(json.loads(os.environ.get("SHMBUS_LOAD_OPTS") or "{}"))


async def asgi_app(scope: Any, receive: Any, send: Any) -> None:
    app = _mb.get("asgi")
    if app is None:
        from shmbus.adapters.asgi import MessageBusMiddleware

        app = _mb["asgi"] = MessageBusMiddleware(None, bus=_bus(), **_opts())
    await app(scope, receive, send)


def __getattr__(name: str) -> Any:
    """``native_app`` and ``ordinary_app``: built on first access (the server process sets the environment
    before importing)."""
    if name == "ordinary_app":  # the same object for uvicorn and the lean worker (served natively there)
        return _ordinary()
    if name != "native_app":
        raise AttributeError(name)
    app = _mb.get("native")
    if app is None:
        from shmbus.adapters.asgi import MessageBusMiddleware

        app = _mb["native"] = MessageBusMiddleware(None, bus=_bus(), **_opts())
    return app


# ---------------------------------------------------------------------------------------------- the ordinary app
#: every client is in group 0 ("everyone") and one of 8 others; the bench publishes to group 0, so every client
#: may see every message but the targeting rules run (as for a Discourse topic visible to a group)
SITE = "s1"
EXTRA_HEADERS = {"x-bench-app": "ordinary"}
ORDINARY_GROUPS = 8


def user_of(scope: Any) -> int | None:
    """The user of a poll: the number after the ``x`` of the bench's client ids (``c0x17`` -> 17)."""
    parts = scope["path"].split("/")
    if len(parts) > 2 and "x" in parts[2]:
        tail = parts[2].rsplit("x", 1)[1]
        return int(tail) if tail.isdigit() else None
    return None


def groups_of(scope: Any) -> list[int]:
    user = user_of(scope)
    return [0] if user is None else [0, 1 + user % ORDINARY_GROUPS]


def _form(body: bytes) -> dict[str, str]:
    from urllib.parse import parse_qsl

    return dict(parse_qsl(body.decode()))


async def _publish_view(scope: Any, receive: Any, send: Any) -> None:
    """The app's own route: ``POST /publish`` (form: channel, data, optional group) calls ``bus.publish``."""
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
        return
    body = b""
    while True:
        m = await receive()
        body += m.get("body", b"")
        if not m.get("more_body"):
            break
    if scope["method"] != "POST" or scope["path"] != "/publish":
        await send({"type": "http.response.start", "status": 404, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"not found"})
        return
    form = _form(body)
    group = form.get("group")
    _bus().publish(form["channel"], form.get("data"), site_id=SITE, group_ids=None if group is None else [int(group)])
    headers = [(b"content-type", b"text/html"), (b"content-length", b"4")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"sent"})


def _profile_on_signal(prefix: str) -> None:
    """``SHMBUS_BENCH_CPROFILE=PREFIX``: SIGUSR2 starts cProfile on this worker's loop thread, the next SIGUSR2
    stops it and writes PREFIX.<pid> (pstats); the bench sends them around the measured window."""
    import cProfile
    import signal
    import time

    prof = cProfile.Profile(time.thread_time)  # CPU time of the loop thread: wall time counts preemption
    state = {"on": False}

    def toggle(*_: Any) -> None:
        if not state["on"]:
            state["on"] = True
            prof.enable()
        else:
            prof.disable()
            prof.dump_stats(f"{prefix}.{os.getpid()}")

    signal.signal(signal.SIGUSR2, toggle)


def _ordinary() -> Any:
    app = _mb.get("ordinary")
    if app is None:
        if os.environ.get("SHMBUS_BENCH_CPROFILE"):
            _profile_on_signal(os.environ["SHMBUS_BENCH_CPROFILE"])
        from shmbus.adapters.asgi import MessageBusMiddleware

        app = _mb["ordinary"] = MessageBusMiddleware(
            _publish_view,
            bus=_bus(),
            user_id_lookup=user_of,
            group_ids_lookup=groups_of,
            site_id_lookup=lambda scope: SITE,
            extra_response_headers_lookup=lambda scope: EXTRA_HEADERS,
            **_opts(),
        )
    return app


#: ``gunicorn -k`` value of the shmbus server's worker (perf/bench_http_*.py measure it next to uvicorn)
SERVER_WORKER = "shmbus.adapters.server.GunicornWorker"


def wsgi_app(environ: dict[str, Any], start_response: Any) -> Any:
    app = _mb.get("wsgi")
    if app is None:
        from shmbus.adapters.wsgi import MessageBusMiddleware

        app = _mb["wsgi"] = MessageBusMiddleware(None, bus=_bus(), **_opts())
    return app(environ, start_response)


_JSON_HEADERS = [
    (b"cache-control", b"must-revalidate, private, max-age=0"),
    (b"content-type", b"application/json; charset=utf-8"),
    (b"pragma", b"no-cache"),
    (b"expires", b"0"),
    (b"content-length", b"2"),
]
_STREAM_HEADERS = [
    (b"cache-control", b"must-revalidate, private, max-age=0"),
    (b"pragma", b"no-cache"),
    (b"expires", b"0"),
    (b"content-type", b"text/plain; charset=utf-8"),
    (b"x-content-type-options", b"nosniff"),
]


async def bare_asgi(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
        return
    while True:  # read the body, as the middleware does
        m = await receive()
        if not m.get("more_body"):
            break
    if b"hold=1" not in scope.get("query_string", b""):
        await send({"type": "http.response.start", "status": 200, "headers": _JSON_HEADERS})
        await send({"type": "http.response.body", "body": b"[]"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": _STREAM_HEADERS})
    await send({"type": "http.response.body", "body": b"[]\r\n|\r\n", "more_body": True})
    while (await receive())["type"] != "http.disconnect":
        await asyncio.sleep(0)
    await send({"type": "http.response.body", "body": b""})
