"""Framework glue: Falcon (WSGI and ASGI), Flask and Starlette/FastAPI, a few lines each."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from shmbus import Bus
from tests import harness

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _poll_body(cid: str = "abc") -> dict[str, Any]:
    return {"url": f"/message-bus/{cid}/poll?dlp=t", "data": {"/fw": "0", "__seq": "1"}}


def test_falcon_wsgi(bus: Bus) -> None:
    falcon = harness.require_module("falcon")
    from shmbus.adapters.integrations.falcon import mount
    from shmbus.adapters.wsgi import MessageBusMiddleware

    class Hello:
        def on_get(self, req: Any, resp: Any) -> None:
            resp.text = "hello"

    api = falcon.App()
    api.add_route("/hello", Hello())
    app = mount(api, bus=bus)
    assert isinstance(app, MessageBusMiddleware)
    bus.publish("/fw", "falcon")
    with httpx.Client(transport=httpx.WSGITransport(app=app), base_url="http://t") as c:
        assert c.get("/hello").text == "hello"
        r = c.post(**_poll_body())
        assert r.json()[0]["data"] == "falcon"
        assert r.headers["content-type"] == "application/json; charset=utf-8"


def test_falcon_asgi(bus: Bus) -> None:
    harness.require_module("falcon")
    import falcon.asgi

    from shmbus.adapters.asgi import MessageBusMiddleware
    from shmbus.adapters.integrations.falcon import mount

    class Hello:
        async def on_get(self, req: Any, resp: Any) -> None:
            resp.text = "hello"

    api = falcon.asgi.App()
    api.add_route("/hello", Hello())
    app = mount(api, bus=bus)
    assert isinstance(app, MessageBusMiddleware)
    bus.publish("/fw", "falcon-asgi")

    async def go() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            assert (await c.get("/hello")).text == "hello"
            assert (await c.post(**_poll_body())).json()[0]["data"] == "falcon-asgi"

    asyncio.run(go())


def test_flask_session_cookie_never_resent(bus: Bus) -> None:
    flask = harness.require_module("flask")
    from shmbus.adapters.integrations.flask import init_app, with_request_context

    app = flask.Flask(__name__)
    app.secret_key = "test"

    @app.route("/login")
    def login() -> str:
        flask.session["user_id"] = 7
        return "in"

    mw = init_app(app, bus=bus, user_id_lookup=with_request_context(app, lambda: flask.session.get("user_id")))
    assert app.extensions["shmbus"] is mw
    bus.publish("/fw", "for-7", user_ids=[7])
    bus.publish("/fw", "for-8", user_ids=[8])
    c = app.test_client()
    r = c.get("/login")
    assert "session=" in r.headers.get("Set-Cookie", "")
    pb = _poll_body()
    r = c.post(pb["url"], data=pb["data"])
    assert "Set-Cookie" not in r.headers
    got = json.loads(r.data)
    assert [m["data"] for m in got if m["channel"] == "/fw"] == ["for-7"]  # the session's user, never 8's
    assert got[-1]["channel"] == "/__status"


def test_starlette_and_fastapi_install(bus: Bus) -> None:
    harness.require_module("starlette")
    from starlette.applications import Starlette
    from starlette.middleware.sessions import SessionMiddleware
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from shmbus.adapters.integrations.starlette import install

    async def hello(request: Any) -> Any:
        request.session["u"] = 1
        return PlainTextResponse("hello")

    app = Starlette(routes=[Route("/hello", hello)])
    app.add_middleware(SessionMiddleware, secret_key="k")
    install(app, bus=bus, long_polling_interval=0.3)
    bus.publish("/fw", "starlette")

    async def go() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            r = await c.get("/hello")
            assert r.text == "hello" and "set-cookie" in r.headers
            r = await c.post(**_poll_body())
            assert r.json()[0]["data"] == "starlette"
            assert "set-cookie" not in r.headers  # the bus is outermost: sessions never see polls

    asyncio.run(go())

    fastapi = harness.require_module("fastapi")
    fa = fastapi.FastAPI()
    install(fa, bus=bus)

    async def go2() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=fa), base_url="http://t") as c:
            assert (await c.post(**_poll_body())).json()[0]["data"] == "starlette"

    asyncio.run(go2())


def test_optional_frameworks_not_imported_by_core() -> None:
    import subprocess
    import sys

    code = (
        "import sys, shmbus, shmbus.adapters.http, shmbus.adapters.wsgi, shmbus.adapters.asgi, "
        "shmbus.adapters.integrations.gunicorn, shmbus.adapters.integrations.uwsgi\n"
        "bad = [m for m in ('falcon', 'flask', 'starlette', 'gevent', 'uvicorn', 'fastapi') if m in sys.modules]\n"
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr
