"""guble's endpoint in-process: header-line safety (commas), user-space isolation (user ids with '/', other
transports on the same bus) and subscriptions that change while messages are in flight."""

from __future__ import annotations

import asyncio
import io
import json
from typing import Any

from shmbus import Bus
from shmbus.adapters.guble import GubleApp
from shmbus.adapters.http import MessageBusProtocol
from shmbus.adapters.transports.identity import Identity
from shmbus.adapters.transports.sink import Sink
from shmbus.adapters.transports.sse import SSEApp
from shmbus.adapters.wsgi import MessageBusMiddleware
from tests.harness.wait import wait_for

from .transport_util import Recorder, drive, http_scope


def _header(scope: Any, name: bytes) -> str | None:
    for k, v in scope.get("headers") or ():
        if k.lower() == name:
            return str(v.decode("latin-1"))
    return None


def guble_app(bus: Bus, **kw: Any) -> GubleApp:
    return GubleApp(
        bus=bus,
        user_id_lookup=lambda scope: _header(scope, b"x-user"),
        application_id_lookup=lambda scope: _header(scope, b"x-app"),
        allow_send=lambda scope, path: True,
        **kw,
    )


def user(name: str, app: str = "phone") -> list[tuple[bytes, bytes]]:
    return [(b"x-user", name.encode()), (b"x-app", app.encode())]


def bodies(frames: list[str]) -> list[tuple[str, str]]:
    """(path, body) of the message frames."""
    out = []
    for f in frames:
        if f.startswith("/"):
            head, _headers, body = f.split("\n", 2)
            out.append((head.split(",", 1)[0], body))
    return out


# ---------------------------------------------------------------------------------------------------- commas
def test_commas_in_paths_are_refused_and_never_forge_a_header_line(bus: Bus) -> None:
    app = guble_app(bus)
    sent = {"done": False}

    def publish(received: list[str]) -> None:
        if not sent["done"] and "#ok-subscribed-to /" in received:
            sent["done"] = True
            bus.publish("/a,7,mallory,app,mid,2020-01-01T00:00:00+00:00", "forged")  # another transport's channel
            bus.publish("/end", "end")

    got = drive(
        app,
        "/stream/",
        ["+ /a,b", "> /a,7,mallory\n\nx", "replay -1 /a,b", "+ /"],
        lambda r: any(f.startswith("/end,") for f in r),
        headers=user("alice"),
        between=publish,
    )
    app.close()
    refusals = [f for f in got if f.startswith("!")]
    assert len(refusals) == 3 and all(
        f.startswith("!error-bad-request a path must not contain commas") for f in refusals
    )
    assert bodies(got) == [("/end", "end")]  # the comma channel was never sent as a header line
    assert bus.last_id("/a,7,mallory") == 0 and bus.last_id("/a,b") == 0  # the send was refused


def test_rest_refuses_a_comma_topic_and_targets_user_topics(bus: Bus) -> None:
    app = guble_app(bus, authorize=lambda scope, channel: True)
    rec = Recorder()

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"x", "more_body": False}

    asyncio.run(app(http_scope("/api/message/a,b", method="POST"), receive, rec))
    assert rec.start()["status"] == 400 and b"commas" in rec.body()
    assert bus.last_id("/a,b") == 0
    # a REST send to a user topic is targeted to its owner too (a digits-only id also as the integer)
    for topic, ids in (("user/bob/common", ["bob"]), ("user/42/common", ["42", 42])):
        rec = Recorder()
        asyncio.run(app(http_scope(f"/api/message/{topic}", method="POST"), receive, rec))
        assert rec.start()["status"] == 200, rec.body()
        assert bus.backlog(f"/{topic}", 0)[0].user_ids == ids
    app.close()


def test_a_user_id_with_a_slash_has_no_user_space(bus: Bus) -> None:
    """User ``bob/x`` would otherwise be subscribed to ``/user/bob/x/...``: topics in bob's space."""
    app = guble_app(bus)
    sent = {"done": False}

    def publish(received: list[str]) -> None:
        if not sent["done"] and "#ok-subscribed-to /end" in received:
            sent["done"] = True
            for ch in ("/user/bob/x/common", "/user/bob/x/phone", "/user/bob/common"):
                bus.publish(ch, "for bob")
            bus.publish("/end", "end")

    got = drive(
        app,
        "/stream/",
        ["+ /user/bob", "+ /user/bob/x", "+ /end"],
        lambda r: any(f.startswith("/end,") for f in r),
        headers=user("bob/x"),
        between=publish,
    )
    assert json.loads(got[0].split("\n")[1])["UserId"] == "bob/x"
    assert bodies(got) == [("/end", "end")]
    # no user space at all: not subscribed to /user/bob/x/<app> and /user/bob/x/common (bob's topics)
    for name in ("bob/x", "a,b"):
        identity = Identity(None, MessageBusProtocol.lookups(name, None, None))
        sink = asyncio.run(app.open_sink(identity, {"type": "websocket", "headers": user(name)}))
        assert sink.patterns == {}, (name, sink.patterns)
    sink = asyncio.run(app.open_sink(Identity(None, MessageBusProtocol.lookups("bob", None, None)), {"headers": []}))
    assert {p for p, _kind in sink.patterns} == {f"/user/bob/{sink.application_id}", "/user/bob/common"}
    app.close()


# ---------------------------------------------------------------------------------------------------- other transports
def _send_to_bob(bus: Bus) -> None:
    app = guble_app(bus)
    got = drive(
        app, "/stream/", ["> /user/bob/common m1\n\nsecret"], lambda r: any("ok-send" in f for f in r), user("alice")
    )
    app.close()
    assert any(f.startswith("#ok-send m1") for f in got), got


def _poll(bus: Bus, user_id: str) -> list[Any]:
    mw = MessageBusMiddleware(bus=bus, user_id_lookup=lambda env: env.get("HTTP_X_USER"))
    body = b"/user/bob/common=0"
    environ = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/message-bus/c1/poll",
        "QUERY_STRING": "dlp=t",
        "CONTENT_TYPE": "application/x-www-form-urlencoded",
        "CONTENT_LENGTH": str(len(body)),
        "wsgi.input": io.BytesIO(body),
        "wsgi.multithread": True,
        "SERVER_PROTOCOL": "HTTP/1.1",
        "HTTP_X_USER": user_id,
    }
    status: list[str] = []
    out = b"".join(mw(environ, lambda s, h, exc=None: status.append(s)))
    assert status[0].startswith("200"), (status, out)
    return [m for m in json.loads(out) if m["channel"] == "/user/bob/common"]


def _sse_replay(bus: Bus, user_id: str) -> bytes:
    app = SSEApp(bus=bus, user_id_lookup=lambda scope: _header(scope, b"x-user"))
    rec = Recorder()

    async def receive() -> dict[str, Any]:
        while not rec.body_sends:
            await asyncio.sleep(0.005)
        return {"type": "http.disconnect"}

    headers = [(b"x-user", user_id.encode()), (b"last-event-id", f"{bus.epoch}:0".encode())]
    asyncio.run(app(http_scope("/sse", b"prefix=/user&events=channel", headers=headers), receive, rec))
    app.close()
    return rec.body()


def test_user_topic_sends_stay_private_on_every_transport(bus: Bus) -> None:
    _send_to_bob(bus)
    (m,) = bus.backlog("/user/bob/common", 0)
    assert m.user_ids == ["bob"]
    assert _poll(bus, "carol") == [] and b"secret" not in _sse_replay(bus, "carol")
    assert [p["data"]["body"] for p in _poll(bus, "bob")] == ["secret"] and b"secret" in _sse_replay(bus, "bob")


# ---------------------------------------------------------------------------------------------------- re-subscribing
def _last(bus: Bus, channel: str) -> Any:
    return bus.backlog(channel, bus.last_id(channel) - 1)[0]


def test_resubscribing_never_skips_a_message_in_flight(bus: Bus) -> None:
    """A message appended after a subscription but not yet dispatched to the connection's loop is delivered
    after the same subscription is made again (the floor stays the older, smaller one). Deterministic: the sink
    is not registered in a hub, so the test dispatches (``offer``) by hand, after the re-subscription."""
    from shmbus.adapters.guble.protocol import Receive
    from shmbus.adapters.transports.connection import Connection
    from shmbus.adapters.transports.websocket import WebSocketApp

    identity = Identity(None, MessageBusProtocol.lookups(None, None, None))
    # guble: "+ /g" twice
    app = guble_app(bus)
    sink = asyncio.run(app.open_sink(identity, {"headers": []}))
    asyncio.run(app._receive_cmd(sink, Receive("/g", None, None)))  # type: ignore[arg-type]
    bus.publish("/g", "in flight")
    asyncio.run(app._receive_cmd(sink, Receive("/g", None, None)))  # type: ignore[arg-type]
    sink.take()
    sink.offer(_last(bus, "/g"))
    assert bodies(sink.take()) == [("/g", "in flight")]
    app.close()
    # the generic WebSocket app: a channel and a pattern made again; one with a replay sends it once, replayed
    ws = WebSocketApp(bus=bus)
    wsink = asyncio.run(ws.open_sink(identity, {}))
    for cmd in ({"channel": "/w"}, {"pattern": "/p", "kind": "prefix"}, {"channel": "/r"}):
        asyncio.run(ws._subscribe(wsink, cmd, None))
    for ch in ("/w", "/p/x", "/r"):
        bus.publish(ch, f"in flight {ch}")
    for cmd in ({"channel": "/w"}, {"pattern": "/p", "kind": "prefix"}, {"channel": "/r", "last_id": 0}):
        asyncio.run(ws._subscribe(wsink, cmd, None))
    assert [json.loads(f)["data"] for f in wsink.take() if '"op"' not in f] == ["in flight /r"]  # the replay
    for ch in ("/w", "/p/x", "/r"):
        wsink.offer(_last(bus, ch))
    assert [json.loads(f)["data"] for f in wsink.take()] == ["in flight /w", "in flight /p/x"]  # /r: not twice
    ws.close()
    # a direct Connection subscription made again
    csink = Sink(bus, identity, lambda m: str(m.data))
    conn = Connection(bus, csink, {}, lambda fn: fn(), 10)
    conn.subscribe("/c")
    conn.subscribe("/c/*", pattern=True)
    bus.publish("/c", "in flight /c")
    bus.publish("/c/1", "in flight /c/1")
    conn.subscribe("/c")
    conn.subscribe("/c/*", pattern=True)
    csink.offer(_last(bus, "/c"))
    csink.offer(_last(bus, "/c/1"))
    assert csink.take() == ["in flight /c", "in flight /c/1"]


# ---------------------------------------------------------------------------------------------------- at connect
def _connect_only(app: GubleApp, query: bytes = b"") -> list[dict[str, Any]]:
    """Connect to ``app`` in-process and return what it sends until it closes the socket by itself."""
    rec = Recorder()
    events: list[dict[str, Any]] = [{"type": "websocket.connect"}]

    async def receive() -> dict[str, Any]:
        if events:
            return events.pop(0)
        await asyncio.sleep(30)
        return {"type": "websocket.disconnect", "code": 1000}

    scope = {"type": "websocket", "path": "/stream/", "root_path": "", "query_string": query, "headers": user("u")}
    asyncio.run(asyncio.wait_for(app(scope, receive, rec), 20))
    return rec.messages


def test_errors_at_connect_are_guble_status_lines(bus: Bus) -> None:
    app = guble_app(bus)
    sent = _connect_only(app, b"client_id=bad%20id")
    texts = [m["text"] for m in sent if m["type"] == "websocket.send"]
    line, data = texts[0].split("\n")
    assert line.startswith("!error-bad-request invalid client id") and json.loads(data)["reason"] in line
    assert sent[-1]["type"] == "websocket.close" and sent[-1]["code"] == 1008
    app.close()

    def on_open(conn: Any) -> None:
        raise RuntimeError("boom")

    app = guble_app(bus, on_open=on_open)
    sent = _connect_only(app)
    texts = [m["text"] for m in sent if m["type"] == "websocket.send"]
    assert texts == [
        "!error-server-internal the application's on_open hook failed\n"
        '{"reason": "the application\'s on_open hook failed"}'
    ]
    assert sent[-1]["type"] == "websocket.close" and sent[-1]["code"] == 1011
    app.close()


def test_error_server_internal_has_its_json_line(bus: Bus, monkeypatch: Any) -> None:
    app = guble_app(bus)

    def broken(sink: Any, cmd: Any) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(app, "_replay_cmd", broken)
    got = drive(app, "/stream/", ["replay -1 /x", "+ /ok"], lambda r: "#ok-subscribed-to /ok" in r, user("u"))
    app.close()
    text = "internal error (RuntimeError); see the server log"
    assert got[1] == f"!error-server-internal {text}\n" + json.dumps({"reason": text})
    sink = asyncio.run(app.open_sink(Identity(None, MessageBusProtocol.lookups("u", None, None)), {"headers": []}))
    app._on_reset(sink, 1, 2)
    assert sink.take() == [
        "!error-server-internal the bus was reset (epoch 1 -> 2)\n"
        '{"reason": "the bus was reset (epoch 1 -> 2)", "epoch": 2, "previousEpoch": 1}'
    ]


def test_on_open_subscribes_a_guble_connection(bus: Bus) -> None:
    """``on_open(connection)`` may subscribe a guble connection server-side; messages arrive as guble frames,
    callbacks get the channel and data."""
    heard: list[Any] = []

    def on_open(conn: Any) -> None:
        assert conn.user_id == "u" and conn.open
        assert conn.subscribe("/srv/direct") is True
        assert conn.subscribe("/srv/room", pattern="prefix") is True
        assert conn.subscribe("/srv/cb", callback=lambda ch, data: heard.append((ch, data))) is True

    app = guble_app(bus, on_open=on_open)
    sent = {"done": False}

    def publish(received: list[str]) -> None:
        if not sent["done"] and received:
            sent["done"] = True
            for ch in ("/srv/direct", "/srv/room/1", "/srv/cb", "/srv/other"):
                bus.publish(ch, ch)
            bus.publish("/srv/direct", "end")

    got = drive(app, "/stream/", [], lambda r: any(f.endswith("\nend") for f in r), user("u"), between=publish)
    app.close()
    assert [b for _p, b in bodies(got)] == ["/srv/direct", "/srv/room/1", "end"]
    assert got[1].startswith("/srv/direct,1,,,,")
    wait_for(lambda: heard == [("/srv/cb", "/srv/cb")])  # on the bus's listener thread
