"""``subscribe_allowed`` as a parameter of the framework glue: Flask's ``init_app`` (run inside a Flask request
context: ``flask.session`` works in it), Falcon's ``mount`` (WSGI and ASGI) and Starlette/FastAPI's ``install``
(an ``async`` hook). Each refuses ``/private`` and answers ``/fw``."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from shmbus import Bus
from shmbus.adapters.http import REFUSED_HEADER, RequestInfo
from tests import harness

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

POLL = {"url": "/message-bus/abc/poll?dlp=t", "data": {"/fw": "0", "/private": "0", "__seq": "1"}}


def refuses_private(info: RequestInfo, channel: str) -> bool:
    return channel != "/private"


async def refuses_private_async(info: RequestInfo, channel: str) -> bool:
    return channel != "/private"


def seed(bus: Bus) -> None:
    bus.publish("/fw", "open")
    bus.publish("/private", "secret")


def check(response: Any) -> None:
    assert [(m["channel"], m["data"]) for m in response.json()] == [("/fw", "open")]
    assert response.headers[REFUSED_HEADER] == "/private"


def test_flask_init_app_runs_the_hook_in_a_request_context(bus: Bus) -> None:
    flask = harness.require_module("flask")
    from shmbus.adapters.integrations.flask import init_app, with_request_context

    app = flask.Flask(__name__)
    app.secret_key = "test"

    @app.route("/login/<name>")
    def login(name: str) -> str:
        flask.session["user"] = name
        return "in"

    asked: list[Any] = []

    def may_read(info: RequestInfo, channel: str) -> bool:
        asked.append((info.user_id, flask.session.get("user"), flask.request.path))
        return channel != "/private" or flask.session.get("user") == "admin"

    init_app(
        app,
        bus=bus,
        user_id_lookup=with_request_context(app, lambda: flask.session.get("user")),
        subscribe_allowed=may_read,
    )
    seed(bus)
    for name, want in (("alice", ["open"]), ("admin", ["open", "secret"])):
        c = app.test_client()
        c.get(f"/login/{name}")
        r = c.post(POLL["url"], data=POLL["data"])
        assert [m["data"] for m in r.json] == want, name
        assert ("/private" if name == "alice" else None) == r.headers.get(REFUSED_HEADER)
    assert asked[:2] == [("alice", "alice", "/message-bus/abc/poll")] * 2


def test_falcon_mount_wsgi_and_asgi(bus: Bus) -> None:
    harness.require_module("falcon")
    import falcon
    import falcon.asgi

    from shmbus.adapters.integrations.falcon import mount

    seed(bus)
    app = mount(falcon.App(), bus=bus, subscribe_allowed=refuses_private)
    with httpx.Client(transport=httpx.WSGITransport(app=app), base_url="http://t") as c:
        check(c.post(**POLL))
    asgi = mount(falcon.asgi.App(), bus=bus, subscribe_allowed=refuses_private_async)

    async def go() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://t") as c:
            check(await c.post(**POLL))

    asyncio.run(go())


def test_starlette_and_fastapi_install(bus: Bus) -> None:
    harness.require_module("starlette")
    fastapi = harness.require_module("fastapi")
    from starlette.applications import Starlette

    from shmbus.adapters.integrations.starlette import install

    seed(bus)
    for app in (Starlette(), fastapi.FastAPI()):
        install(app, bus=bus, subscribe_allowed=refuses_private_async)

        async def go(app: Any = app) -> None:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
                check(await c.post(**POLL))

        asyncio.run(go())
