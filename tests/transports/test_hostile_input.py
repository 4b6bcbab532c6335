"""Hostile input on every transport, in-process: a malformed glob and deeply nested JSON get a clear refusal
(a 400 with the reason, an error frame, guble's ``!error-bad-request``, a typed exception), never a 500, a dead
connection or a connection left behind in the hub."""

from __future__ import annotations

import asyncio
import io
import json
from typing import Any

import pytest

from shmbus import Bus, InvalidChannel
from shmbus.adapters.guble import GubleApp
from shmbus.adapters.http import MessageBusProtocol
from shmbus.adapters.transports.connection import Connection
from shmbus.adapters.transports.identity import Identity
from shmbus.adapters.transports.rest import AsgiRestPublish, WsgiRestPublish
from shmbus.adapters.transports.sink import Sink
from shmbus.adapters.transports.sse import SSEApp
from shmbus.adapters.transports.sse_wsgi import SSEWSGIApp
from shmbus.adapters.transports.websocket import WebSocketApp

from .transport_util import Recorder, drive, http_scope

BAD_GLOBS = ["/a[]", "/a[!]", "/a[z-a]"]
DEEP = "[" * 100_000


async def _no_body() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


# ---------------------------------------------------------------------------------------------------- globs
@pytest.mark.parametrize("glob", BAD_GLOBS)
def test_sse_asgi_bad_glob_is_400_and_registers_nothing(bus: Bus, glob: str) -> None:
    app = SSEApp(bus=bus)
    rec = Recorder()
    query = f"channel=/ok&glob={glob}&events=channel".encode()
    asyncio.run(app(http_scope("/sse", query), _no_body, rec))
    assert rec.start()["status"] == 400 and b"invalid glob" in rec.body()
    assert app.hub.connections() == 0
    app.close()


@pytest.mark.parametrize("where", ["subscribing", "replaying"])
def test_sse_asgi_a_failing_open_unregisters_the_stream(bus: Bus, monkeypatch: Any, where: str) -> None:
    """Whatever goes wrong while a stream opens, its sink does not stay in the hub (no unbounded growth) and a
    connection already handed out is closed (``on_close`` runs)."""
    import shmbus.adapters.transports.sse as sse_module

    closed: list[Any] = []
    app = SSEApp(bus=bus, on_close=closed.append)

    def broken(*args: Any) -> None:
        raise RuntimeError("boom")

    if where == "subscribing":
        monkeypatch.setattr(Sink, "add_pattern", broken)
    else:
        monkeypatch.setattr(sse_module, "finish_open", broken)
    rec = Recorder()
    asyncio.run(app(http_scope("/sse", b"prefix=/p&events=channel"), _no_body, rec))
    assert rec.start()["status"] == 500 and b"internal error" in rec.body()
    assert app.hub.connections() == 0
    # a connection exists once the stream's own subscriptions are in place; from then on on_close runs
    assert [c.open for c in closed] == ([] if where == "subscribing" else [False])
    app.close()


@pytest.mark.parametrize("glob", BAD_GLOBS)
def test_sse_wsgi_bad_glob_is_400_and_registers_nothing(bus: Bus, glob: str) -> None:
    app = SSEWSGIApp(bus=bus)
    environ = {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": "/sse",
        "QUERY_STRING": f"glob={glob}&events=channel",
        "wsgi.multithread": True,
    }
    got: list[str] = []
    body = b"".join(app(environ, lambda status, headers: got.append(status)))
    assert got[0].startswith("400") and b"invalid glob" in body, (got, body)
    assert app.stats()["connections"] == 0
    app.close()


def test_websocket_bad_glob_gets_an_error_frame_and_the_connection_lives(bus: Bus) -> None:
    app = WebSocketApp(bus=bus)
    frames = [json.dumps({"op": "subscribe", "pattern": g, "kind": "glob", "ref": i}) for i, g in enumerate(BAD_GLOBS)]
    got = drive(app, "/ws", [*frames, '{"op":"ping"}'], lambda r: any('"pong"' in f for f in r))
    app.close()
    replies = [json.loads(f) for f in got[1:]]
    assert [r["op"] for r in replies] == ["error"] * len(BAD_GLOBS) + ["pong"]
    assert all("invalid glob" in r["reason"] for r in replies[:-1]), replies
    assert [r["ref"] for r in replies[:-1]] == list(range(len(BAD_GLOBS)))


@pytest.mark.parametrize("glob", BAD_GLOBS)
def test_connection_subscribe_bad_glob_is_invalid_channel(bus: Bus, glob: str) -> None:
    identity = Identity(None, MessageBusProtocol.lookups(None, None, None))
    sink = Sink(bus, identity, lambda m: b"")
    conn = Connection(bus, sink, {}, lambda fn: fn(), 10)
    with pytest.raises(InvalidChannel, match="invalid glob"):
        conn.subscribe(glob, pattern=True)
    with pytest.raises(InvalidChannel, match="invalid glob"):
        conn.subscribe(glob, pattern="glob", callback=lambda ch, data: None)
    assert sink.patterns == {} and bus.subscriptions.patterns() == ()
    assert conn.subscribe("/a[b-c]", pattern=True) is True  # a well-formed set still works


# ---------------------------------------------------------------------------------------------------- deep JSON
def test_websocket_deep_json_is_an_error_frame(bus: Bus) -> None:
    app = WebSocketApp(bus=bus, max_frame=1 << 20)
    got = drive(app, "/ws", [DEEP, '{"op":"ping"}'], lambda r: any('"pong"' in f for f in r))
    app.close()
    replies = [json.loads(f) for f in got[1:]]
    assert replies[0]["op"] == "error" and "invalid JSON" in replies[0]["reason"]
    assert replies[-1] == {"op": "pong"}


def test_guble_deep_header_json_is_a_bad_request(bus: Bus, caplog: Any) -> None:
    app = GubleApp(bus=bus, max_frame=1 << 20, allow_send=lambda scope, path: True)
    got = drive(app, "/stream/", [f"> /deep\n{DEEP}\n\nbody", "+ /ok"], lambda r: "#ok-subscribed-to /ok" in r)
    app.close()
    assert got[1].startswith("!error-bad-request the header must be a JSON object"), got[1][:200]
    assert not any("error-server-internal" in f for f in got)
    assert "Traceback" not in caplog.text and bus.last_id("/deep") == 0


def test_rest_deep_json_is_400(bus: Bus) -> None:
    headers = {"CONTENT_TYPE": "application/json"}
    wsgi = WsgiRestPublish(bus=bus, authorize=lambda env, ch: True, max_body_size=1 << 20)
    environ = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/message/x",
        "QUERY_STRING": "",
        "CONTENT_LENGTH": str(len(DEEP)),
        "wsgi.input": io.BytesIO(DEEP.encode()),
        **headers,
    }
    got: list[str] = []
    body = b"".join(wsgi(environ, lambda status, h: got.append(status)))
    assert got[0].startswith("400") and b"nested too deeply" in body, (got, body[:200])

    asgi = AsgiRestPublish(bus=bus, authorize=lambda scope, ch: True, max_body_size=1 << 20)
    rec = Recorder()

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": DEEP.encode(), "more_body": False}

    scope = http_scope("/message/x", method="POST", headers=[(b"content-type", b"application/json")])
    asyncio.run(asgi(scope, receive, rec))
    assert rec.start()["status"] == 400 and b"nested too deeply" in rec.body()
    assert bus.last_id("/x") == 0


def test_message_bus_poll_deep_json_is_400(bus: Bus, monkeypatch: Any) -> None:
    """The long-poll body parser: without orjson the stdlib parser raises RecursionError on deep nesting."""
    from shmbus import jsonlib
    from shmbus.adapters.wsgi import MessageBusMiddleware

    monkeypatch.setattr(jsonlib, "loads", json.loads)  # what an install without orjson uses
    app = MessageBusMiddleware(bus=bus, max_body_size=1 << 20)
    environ = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/message-bus/c1/poll",
        "QUERY_STRING": "dlp=t",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(DEEP)),
        "wsgi.input": io.BytesIO(DEEP.encode()),
        "wsgi.multithread": True,
        "SERVER_PROTOCOL": "HTTP/1.1",
    }
    got: list[str] = []
    body = b"".join(app(environ, lambda status, headers, exc=None: got.append(status)))
    assert got[0].startswith("400") and b"malformed JSON" in body, (got, body[:200])
