"""REST publish: ASGI through a real uvicorn (httpx) and WSGI in-process; the same answers from both."""

from __future__ import annotations

import io
import json
from typing import Any
from urllib.parse import unquote

import httpx
import pytest

from shmbus import Bus
from shmbus.adapters.transports.rest import AsgiRestPublish, WsgiRestPublish
from tests import harness

TOKEN = {"x-token": "secret"}
JSON = {"content-type": "application/json", **TOKEN}

# (method, path, query, headers, body, status, reason substring)
CASES: list[tuple[str, str, str, dict[str, str], bytes, int, str]] = [
    ("POST", "/api/message/x", "", {"content-type": "application/json"}, b"1", 403, "not authorised"),
    ("POST", "/api/message/private/x", "", JSON, b"1", 403, "not authorised"),
    ("GET", "/api/message/x", "", TOKEN, b"", 405, "use POST"),
    ("POST", "/api/message/", "", JSON, b"1", 400, "missing channel"),
    ("POST", "/api/message/a$|$b", "", JSON, b"1", 400, "site separator"),
    ("POST", "/api/message/__mb_keepalive__/", "", JSON, b"1", 400, "reserved"),
    ("POST", "/api/message/x", "", JSON, b"{nope", 400, "invalid JSON"),
    ("POST", "/api/message/x", "", {"content-type": "text/plain", **TOKEN}, b"\xff", 400, "not valid UTF-8"),
    ("POST", "/api/message/x", "", {"content-type": "image/png", **TOKEN}, b"1", 415, "unsupported content type"),
    ("POST", "/api/message/x", "userId=marvin", JSON, b"1", 400, "unknown query parameter"),
    ("POST", "/api/message/x", "user_ids=", JSON, b"1", 400, "user_ids: ids must be"),
    ("POST", "/api/message/x", "site_id=", JSON, b"1", 400, "site_id must not be empty"),
    ("POST", "/api/message/global/x", "user_ids=1", JSON, b"1", 400, "cannot be used on /global/"),
    ("POST", "/api/message/x", "", JSON, b"[" + b"1," * 40_000 + b"1]", 413, "too large"),
]


def _check_ok(bus: Bus, status: int, body: bytes) -> None:
    assert status == 200, body
    answer = json.loads(body)
    assert answer == {"channel": "/chat/1", "message_id": 1}
    (m,) = bus.backlog("/chat/1", 0, "s1")
    assert m.data == {"text": "héllo"}
    assert m.user_ids == [1, 2] and m.group_ids == [7, "staff"] and m.client_ids == ["tab-1", "42"]
    assert m.site_id == "s1"


def test_asgi_through_uvicorn(bus: Bus, server: Any, sse: Any) -> None:
    srv = server()
    url = srv.url + "/api/message"
    query = "user_ids=1,2&group_ids=7&group_ids=staff&client_ids=tab-1,42&site_id=s1"
    with httpx.Client(trust_env=False, timeout=20) as h:
        for method, path, q, headers, body, status, reason in CASES:
            r = h.request(method, srv.url + path + (f"?{q}" if q else ""), headers=headers, content=body)
            assert (r.status_code, reason in r.text) == (status, True), (path, q, headers, r.status_code, r.text)
        assert bus.backlog(None, 0) == []  # nothing refused was published
        # a targeted publish reaches an SSE client of that user only
        params = [("channel", "/chat/1"), ("channel", "/global/end"), ("client_id", "tab-1")]
        mine = sse(srv.url + "/sse", params=params, headers={"x-user": "2", "x-site": "s1"})
        other = sse(srv.url + "/sse", params=params, headers={"x-user": "3", "x-site": "s1"})
        r = h.post(f"{url}/chat/1?{query}", headers=JSON, content=json.dumps({"text": "héllo"}).encode())
        _check_ok(bus, r.status_code, r.content)
        assert h.post(f"{url}/global/end", headers=TOKEN, content=b"end").json()["message_id"] == 1
        assert [e.event for e in mine.messages_until("/global/end")] == ["/chat/1", "/global/end"]
        assert [e.event for e in other.messages_until("/global/end")] == ["/global/end"]
        assert bus.backlog("/global/end", 0)[0].data == "end"  # no content type: text
        assert h.get(srv.url + "/health").status_code == 200  # other paths reach the wrapped app


def _wsgi(
    app: WsgiRestPublish,
    method: str,
    path: str,
    query: str = "",
    headers: dict[str, str] | None = None,
    body: bytes = b"",
) -> tuple[int, bytes]:
    environ: dict[str, Any] = {
        "REQUEST_METHOD": method,
        "SCRIPT_NAME": "",
        "QUERY_STRING": query,
        "SERVER_NAME": "x",
        "SERVER_PORT": "80",
        "PATH_INFO": unquote(path, encoding="utf-8").encode("utf-8").decode("latin-1"),
        "CONTENT_LENGTH": str(len(body)),
        "wsgi.input": io.BytesIO(body),
        "wsgi.url_scheme": "http",
    }
    for k, v in (headers or {}).items():
        if k == "content-type":
            environ["CONTENT_TYPE"] = v
        else:
            environ["HTTP_" + k.upper().replace("-", "_")] = v
    got: list[Any] = []
    out = b"".join(app(environ, lambda status, hdrs: got.append((status, hdrs))))
    return int(got[0][0].split()[0]), out


def _authorize_environ(environ: Any, channel: str) -> bool:
    return environ.get("HTTP_X_TOKEN") == "secret" and not channel.startswith("/private")


def test_wsgi_in_process(bus: Bus) -> None:
    app = WsgiRestPublish(bus=bus, authorize=_authorize_environ, prefix="/api/message/")
    for method, path, q, headers, body, status, reason in CASES:
        got, out = _wsgi(app, method, path, q, headers, body)
        assert (got, reason in out.decode("utf-8", "replace")) == (status, True), (path, q, got, out)
    assert _wsgi(app, "POST", "/elsewhere", headers=JSON, body=b"1")[0] == 404
    assert bus.backlog(None, 0) == []
    status, out = _wsgi(
        app,
        "POST",
        "/api/message/chat/1",
        "user_ids=1,2&group_ids=7&group_ids=staff&client_ids=tab-1,42&site_id=s1",
        JSON,
        json.dumps({"text": "héllo"}).encode(),
    )
    _check_ok(bus, status, out)
    # a UTF-8 channel name survives the WSGI latin-1 path
    status, out = _wsgi(app, "POST", "/api/message/caf%C3%A9", headers=TOKEN, body="ünïcode".encode())
    assert status == 200 and json.loads(out)["channel"] == "/café"
    assert bus.backlog("/café", 0)[0].data == "ünïcode"


def test_bus_off_is_503(bus: Bus) -> None:
    app = WsgiRestPublish(bus=bus, authorize=lambda env, ch: True)
    bus.off()
    try:
        status, out = _wsgi(app, "POST", "/message/x", headers={"content-type": "application/json"}, body=b"1")
    finally:
        bus.on()
    assert status == 503 and b"off" in out


def test_authorize_is_mandatory(bus: Bus) -> None:
    for cls in (AsgiRestPublish, WsgiRestPublish):
        with pytest.raises(TypeError):
            cls(bus=bus)  # type: ignore[call-arg]
        with pytest.raises(TypeError, match="authorize"):
            cls(bus=bus, authorize=None)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="authorize"):
            cls(bus=bus, authorize="yes")  # type: ignore[arg-type]


@pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")
def test_mounts_in_starlette_and_wraps_falcon_asgi(bus: Bus) -> None:
    """The documented compositions: a Starlette ``Mount`` (root_path) and wrapping a Falcon ASGI app."""
    starlette = harness.require_module("starlette")
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Mount, Route
    from starlette.testclient import TestClient

    assert starlette
    rest = AsgiRestPublish(bus=bus, authorize=lambda scope, ch: ch.startswith("/ok"))
    app = Starlette(routes=[Route("/", lambda request: PlainTextResponse("home")), Mount("/bus", app=rest)])
    with TestClient(app) as client:
        r = client.post("/bus/message/ok/1", json={"a": 1})
        assert r.status_code == 200 and r.json() == {"channel": "/ok/1", "message_id": 1}
        assert client.post("/bus/message/no", json=1).status_code == 403
        assert client.get("/").text == "home"
    assert bus.backlog("/ok/1", 0)[0].data == {"a": 1}

    falcon_asgi = harness.require_module("falcon.asgi")

    class Hello:
        async def on_get(self, req: Any, resp: Any) -> None:
            resp.text = "hello"

    fapp = falcon_asgi.App()
    fapp.add_route("/hello", Hello())
    wrapped = AsgiRestPublish(fapp, bus=bus, authorize=lambda scope, ch: True)
    client = TestClient(wrapped)  # no lifespan: Falcon's waits for a shutdown TestClient's portal never sends
    assert client.get("/hello").text == "hello"
    assert client.post("/message/ok/2", content=b"hi").json()["message_id"] == 1
    assert bus.backlog("/ok/2", 0)[0].data == "hi"
