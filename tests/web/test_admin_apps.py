"""The admin page's and the metrics endpoint's shells in-process: who gets in, what bad requests get, and that
the tail never shows a targeted payload."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Iterator
from typing import Any

import pytest

from shmbus import Bus
from shmbus.adapters.admin import AdminApp, AdminWSGIApp, read_tail
from shmbus.adapters.metrics import MetricsApp, MetricsWSGIApp, render


@pytest.fixture
def bus(bus_name: str) -> Iterator[Bus]:
    b = Bus(bus_name, ring_size=1 << 20, keepalive_interval=0)
    b.publish("/room", {"text": "hello"})
    b.publish("/room", {"text": "for user 7 only"}, user_ids=[7])
    b.publish("/room", {"text": "for a client"}, client_ids=["abc"])
    b.publish("/room", {"text": "bye"})
    yield b
    b.destroy()


def asgi_get(app: Any, path: str, query: str = "", admin: bool = True, method: str = "GET") -> tuple[int, dict, bytes]:
    sent: list[dict[str, Any]] = []
    headers = [(b"x-admin", b"yes")] if admin else []
    scope = {"type": "http", "method": method, "path": path, "query_string": query.encode(), "headers": headers}
    calls = 0

    async def receive() -> dict[str, Any]:
        nonlocal calls
        calls += 1
        if calls == 1:
            return {"type": "http.request", "body": b"", "more_body": False}
        while not any(m.get("more_body") for m in sent if m["type"] == "http.response.body"):
            await asyncio.sleep(0.01)
        return {"type": "http.disconnect"}  # after the first event of a stream

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(asyncio.wait_for(app(scope, receive, send), 20))
    start = sent[0]
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, body


def is_admin(scope: Any) -> bool:
    return (b"x-admin", b"yes") in scope["headers"]


async def is_admin_async(scope: Any) -> bool:
    return is_admin(scope)


@pytest.mark.parametrize("lookup", [is_admin, is_admin_async])
def test_asgi_admin_routes(bus: Bus, lookup: Any) -> None:
    app = AdminApp(bus=bus, is_admin_lookup=lookup)
    for path in ("/admin", "/admin/", "/admin/snapshot.json", "/admin/events", "/admin/static/admin.js"):
        status, _, body = asgi_get(app, path, admin=False)
        assert status == 403 and b"admin" in body, path
    status, headers, _ = asgi_get(app, "/admin")
    assert status == 308 and headers["location"] == "/admin/"
    status, headers, body = asgi_get(app, "/admin/")
    assert status == 200 and b"uPlot.iife.min.js" in body and headers["x-frame-options"] == "DENY"
    assert f"&quot;bus&quot;: &quot;{bus.name}&quot;".encode() in body  # the config, escaped into an attribute
    for name in ("admin.js", "admin.css", "uPlot.iife.min.js", "uPlot.min.css"):
        status, _, body = asgi_get(app, f"/admin/static/{name}")
        assert status == 200 and body, name
    for bad in ("../app.py", "LICENSE.uPlot", "index.html", "%2e%2e/app.py"):
        assert asgi_get(app, f"/admin/static/{bad}")[0] == 404, bad
    assert asgi_get(app, "/admin/snapshot.json", method="POST")[0] == 405
    assert asgi_get(app, "/elsewhere")[0] == 404  # no wrapped app
    for query in (
        "tail=/" + "x" * 400,
        "tail=/room&after=x",
        "tail=/room&after=-1",
        "tail=/a%00b",
        "tail=/room&site=a%24%7C%24b",
        "tail=/room&site=" + "s" * 40,
    ):
        status, _, body = asgi_get(app, "/admin/snapshot.json", query)
        assert status == 400 and body, query
    status, _, body = asgi_get(app, "/admin/snapshot.json", "tail=/room")
    doc = json.loads(body)
    assert doc["sample"]["global_id"] == 4 and doc["sample"]["channels"]["count"] == 1
    assert [m.get("data") for m in doc["tail"]["messages"]] == [
        '{"text":"hello"}',
        None,
        None,
        '{"text":"bye"}',
    ]
    assert b"for user 7" not in body and b"for a client" not in body
    assert asgi_get(app, "/admin/events", "tail=/room&site=" + "s" * 40)[0] == 400
    status, headers, body = asgi_get(app, "/admin/events", "tail=/room")
    assert status == 200 and headers["content-type"] == "text/event-stream"
    first = json.loads(body.split(b"\n\n")[0].removeprefix(b"data: "))
    assert first["sample"]["global_id"] == 4 and len(first["tail"]["messages"]) == 4
    assert b"for user 7" not in body


def test_asgi_admin_passes_other_paths_to_the_app(bus: Bus) -> None:
    async def inner(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    app = AdminApp(inner, bus=bus, is_admin_lookup=is_admin, path="/ops")
    assert asgi_get(app, "/admin/", admin=False)[0] == 204
    assert asgi_get(app, "/opsx", admin=False)[0] == 204
    assert asgi_get(app, "/ops/", admin=False)[0] == 403


def test_admin_needs_an_admin_lookup(bus: Bus) -> None:
    with pytest.raises(TypeError, match="is_admin_lookup"):
        AdminApp(bus=bus, is_admin_lookup=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="path"):
        AdminApp(bus=bus, is_admin_lookup=is_admin, path="admin/")


def wsgi_get(app: Any, path: str, query: str = "", admin: bool = True, method: str = "GET") -> tuple[str, bytes]:
    out: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        out["status"], out["headers"] = status, dict(headers)

    environ = {
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "QUERY_STRING": query,
        "SCRIPT_NAME": "",
        "wsgi.input": io.BytesIO(),
    }
    if admin:
        environ["HTTP_X_ADMIN"] = "yes"
    body = b"".join(app(environ, start_response))
    return out["status"], body


def test_wsgi_admin_routes(bus: Bus) -> None:
    app = AdminWSGIApp(bus=bus, is_admin_lookup=lambda environ: environ.get("HTTP_X_ADMIN") == "yes")
    assert wsgi_get(app, "/admin/", admin=False)[0].startswith("403")
    assert wsgi_get(app, "/admin/snapshot.json", method="POST")[0].startswith("405")
    status, body = wsgi_get(app, "/admin/snapshot.json", "tail=/room")
    assert status.startswith("200")
    doc = json.loads(body)
    assert len(doc["tail"]["messages"]) == 4 and b"for user 7" not in body
    assert wsgi_get(app, "/admin/events")[0].startswith("404")  # the page polls instead
    assert wsgi_get(app, "/admin/snapshot.json", "tail=/room&after=zz")[0].startswith("400")

    async def not_plain(environ: Any) -> bool:
        return True

    with pytest.raises(TypeError, match="plain"):
        wsgi_get(AdminWSGIApp(bus=bus, is_admin_lookup=not_plain), "/admin/")


def test_tail_reads_only_what_follows(bus: Bus) -> None:
    tail = read_tail(bus, "/room", 3)
    assert [m["id"] for m in tail["messages"]] == [4] and tail["last_id"] == 4
    assert read_tail(bus, "/room", 4)["messages"] == []
    assert read_tail(bus, "/nothing", None) == {"channel": "/nothing", "last_id": 0, "messages": []}


def test_metrics_apps(bus: Bus) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    fams = {f.name: f for f in text_string_to_metric_families(render(bus))}
    assert fams["shmbus_published_messages"].samples[0].value == 4
    assert fams["shmbus_global_id"].samples[0].labels == {"bus": bus.name}

    app = MetricsApp(bus=bus, allow=is_admin)
    status, headers, body = asgi_get(app, "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
    assert b"shmbus_ring_used_bytes" in body
    assert asgi_get(app, "/metrics", admin=False)[0] == 403
    assert asgi_get(app, "/metrics", method="POST")[0] == 405
    assert asgi_get(app, "/other")[0] == 404
    wapp = MetricsWSGIApp(bus=bus)
    status, body = wsgi_get(wapp, "/metrics")
    assert status.startswith("200") and b"shmbus_processes" in body
    assert wsgi_get(wapp, "/nope")[0].startswith("404")
