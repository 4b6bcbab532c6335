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
    b = Bus(bus_name, ring_size=1 << 20, keepalive_interval=0, create=True)
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
        while not any(b"\ndata: " in m.get("body", b"") for m in sent if m["type"] == "http.response.body"):
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
    assert asgi_get(app, "/admin/events", "view=v1234567&tail=/room&site=" + "s" * 40)[0] == 400
    for view in ("", "short", "x" * 65, "bad/view1"):
        status, _, body = asgi_get(app, "/admin/events", f"view={view}&tail=/room")
        assert status == 400 and b"view" in body, view
    status, headers, body = asgi_get(app, "/admin/events", "view=v1234567&tail=/room")
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    first = first_event(body)
    assert first["channel"] == "/_shmbus_admin/v1234567"  # a bus message on the view's channel
    assert first["data"]["sample"]["global_id"] == 4 and len(first["data"]["tail"]["messages"]) == 4
    assert b"for user 7" not in body


def first_event(stream: bytes) -> dict[str, Any]:
    """The data of the first message event of an SSE stream (the bus's SSE format: event name = channel)."""
    for event in stream.split(b"\n\n"):
        fields = dict(line.split(b": ", 1) for line in event.split(b"\n") if b": " in line and line[:1] != b":")
        if fields.get(b"event", b"").startswith(b"/"):
            doc: dict[str, Any] = json.loads(fields[b"data"])
            return doc
    raise AssertionError(f"no message event in {stream!r}")


def test_the_admin_feed_reaches_no_other_transport(bus: Bus) -> None:
    """The samples travel on the bus, but only the admin stream can deliver them: a public SSE stream of the
    same process subscribed to every channel (prefix "/") and a bus subscriber see the messages' targeting."""
    from shmbus.adapters.transports.sse import SSEApp

    admin = AdminApp(bus=bus, is_admin_lookup=is_admin)
    public = SSEApp(bus=bus, path="/sse", user_id_lookup=lambda scope: admin.viewer.upper())
    seen: list[Any] = []
    bus.subscribe("/_shmbus_admin/", seen.append, pattern="prefix")

    async def both() -> tuple[bytes, bytes]:
        public_out: list[bytes] = []
        stop = asyncio.Event()

        async def public_receive() -> dict[str, Any]:
            if not public_out:
                public_out.append(b"")
                return {"type": "http.request", "body": b"", "more_body": False}
            await stop.wait()
            return {"type": "http.disconnect"}

        async def public_send(message: dict[str, Any]) -> None:
            public_out.append(message.get("body", b""))

        scope = {
            "type": "http",
            "method": "GET",
            "path": "/sse",
            "query_string": b"prefix=/&events=channel",
            "headers": [],
        }
        task = asyncio.ensure_future(public.__call__(scope, public_receive, public_send))
        await asyncio.sleep(0.2)
        _, _, admin_body = await asyncio.to_thread(asgi_get, admin, "/admin/events", "view=v1234567")
        await asyncio.sleep(0.2)
        stop.set()
        await task
        return admin_body, b"".join(public_out)

    admin_body, public_body = asyncio.run(both())
    assert first_event(admin_body)["data"]["sample"]["bus"] == bus.name
    assert b"_shmbus_admin" not in public_body and b"sample" not in public_body
    assert seen and all(m.user_ids == [admin.viewer] for m in seen)  # on the bus, targeted at the viewer only


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
    assert wsgi_get(app, "/admin/events")[0].startswith("400")  # no view
    status, body = wsgi_get(app, "/admin/events", "view=v1234567")
    assert status.startswith("503") and b"gevent or threaded" in body  # a sync worker: the page polls instead
    # a threaded worker streams: the first event is the view's sample, sent as a bus message
    out: dict[str, Any] = {}
    environ = {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": "/admin/events",
        "QUERY_STRING": "view=v1234567&tail=/room",
        "SCRIPT_NAME": "",
        "wsgi.input": io.BytesIO(),
        "wsgi.multithread": True,
        "HTTP_X_ADMIN": "yes",
    }
    stream = iter(app(environ, lambda status, headers: out.update(status=status)))
    got = b""
    while b"\ndata: " not in got:
        got += next(stream)
    stream.close()  # type: ignore[attr-defined]
    assert out["status"].startswith("200")
    first = first_event(got)
    assert first["channel"] == "/_shmbus_admin/v1234567" and len(first["data"]["tail"]["messages"]) == 4
    assert b"for user 7" not in got
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


def test_the_admin_page_shows_presence_per_channel(bus: Bus) -> None:
    from shmbus.presence import hub_for
    from tests.harness.wait import wait_for

    hub = hub_for(bus)
    hub.touch("alice", 7, ["/room", "/lobby"], lease=60)
    hub.touch("bob", None, ["/room"], lease=60)
    app = AdminWSGIApp(bus=bus, is_admin_lookup=lambda environ: environ.get("HTTP_X_ADMIN") == "yes")

    def presence() -> Any:
        status, body = wsgi_get(app, "/admin/snapshot.json")
        assert status.startswith("200")
        return json.loads(body)["presence"]

    wait_for(lambda: presence()["clients"] == 3, 20, "both clients on the admin page")
    doc = presence()
    assert [(c["channel"], c["count"]) for c in doc["busiest"]] == [("/room", 2), ("/lobby", 1)]
    assert sorted(map(tuple, doc["busiest"][0]["members"])) == [("alice", 7), ("bob", None)]
    off = AdminWSGIApp(bus=bus, is_admin_lookup=lambda environ: True, presence=False)
    assert "presence" not in json.loads(wsgi_get(off, "/admin/snapshot.json")[1])
    assert b'id="presence"' in wsgi_get(app, "/admin/")[1]
