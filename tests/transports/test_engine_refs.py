"""Engines hear of the transports' subscriptions (the iodine draft: an attached engine is told of every
subscription of the process, once per channel or pattern), with the pattern kind passed as engines know it:
a channel as itself, a glob as a pattern, a prefix ``/p`` as the channel ``/p`` and the pattern ``/p/**``."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from shmbus import Bus, PubSubEngine
from shmbus.adapters.guble import GubleApp
from shmbus.adapters.transports.sse import SSEApp
from shmbus.adapters.transports.sse_wsgi import SSEWSGIApp
from shmbus.adapters.transports.websocket import WebSocketApp

from .transport_util import Recorder, drive, http_scope


class Recording(PubSubEngine):
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, bool]] = []

    def subscribe(self, to: str, is_pattern: bool = False) -> bool:
        self.calls.append(("sub", to, is_pattern))
        return True

    def unsubscribe(self, from_: str, is_pattern: bool = False) -> bool:
        self.calls.append(("unsub", from_, is_pattern))
        return True

    def publish(self, channel: str, message: str) -> bool:
        return True


def _attached(bus: Bus) -> Recording:
    engine = Recording()
    bus.attach(engine)
    return engine


def test_websocket_subscriptions_reach_engines_once_with_their_kind(bus: Bus) -> None:
    engine = _attached(bus)
    app = WebSocketApp(bus=bus)
    commands = [
        {"op": "subscribe", "channel": "/e"},
        {"op": "subscribe", "channel": "/e"},  # again: no second engine call
        {"op": "subscribe", "pattern": "/p", "kind": "prefix"},
        {"op": "subscribe", "pattern": "/g/*", "kind": "glob"},
        {"op": "unsubscribe", "pattern": "/g/*", "kind": "glob"},
    ]
    frames = [json.dumps(c) for c in commands]
    during: list[Any] = []

    def done(received: list[str]) -> bool:
        if sum('"unsubscribed"' in f for f in received) < 1:
            return False
        during.append(list(engine.calls))
        return True

    drive(app, "/ws", frames, done)
    app.close()
    assert during[0] == [
        ("sub", "/e", False),
        ("sub", "/p", False),
        ("sub", "/p/**", True),
        ("sub", "/g/*", True),
        ("unsub", "/g/*", True),
    ]
    assert sorted(engine.calls[len(during[0]) :]) == [
        ("unsub", "/e", False),
        ("unsub", "/p", False),
        ("unsub", "/p/**", True),
    ]
    assert bus.engines.subscribed() == {}


def test_a_bus_subscriber_and_a_connection_share_one_engine_subscription(bus: Bus) -> None:
    """The engine subscription lasts while anyone in the process needs it: the bus subscriber leaving while the
    connection stays is no ``unsubscribe``; the connection leaving last is."""
    engine = _attached(bus)
    sub = bus.subscribe("/shared", lambda m: None)
    app = WebSocketApp(bus=bus)
    during: list[Any] = []

    def done(received: list[str]) -> bool:
        if not any('"subscribed"' in f for f in received):
            return False
        bus.unsubscribe("/shared", sub)
        during.append(list(engine.calls))
        return True

    drive(app, "/ws", ['{"op":"subscribe","channel":"/shared"}'], done)
    app.close()
    assert during[0] == [("sub", "/shared", False)]
    assert engine.calls == [("sub", "/shared", False), ("unsub", "/shared", False)]


def test_sse_streams_reach_engines(bus: Bus) -> None:
    engine = _attached(bus)
    app = SSEApp(bus=bus)
    rec = Recorder()
    seen: list[Any] = []

    async def receive() -> dict[str, Any]:
        while not rec.body_sends:
            await asyncio.sleep(0.005)
        seen.append(list(engine.calls))
        return {"type": "http.disconnect"}

    asyncio.run(app(http_scope("/sse", b"channel=/s&prefix=/sp&glob=/sg/**&events=channel"), receive, rec))
    app.close()
    assert seen[0] == [("sub", "/s", False), ("sub", "/sp", False), ("sub", "/sp/**", True), ("sub", "/sg/**", True)]
    assert len(engine.calls) == 8 and bus.engines.subscribed() == {}

    wsgi = SSEWSGIApp(bus=bus)
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/sse", "QUERY_STRING": "channel=/w", "wsgi.multithread": True}
    response: Any = wsgi(environ, lambda status, headers: None)
    next(iter(response))
    assert engine.calls[-1] == ("sub", "/w", False)
    response.close()
    wsgi.close()
    assert engine.calls[-1] == ("unsub", "/w", False) and bus.engines.subscribed() == {}


def test_guble_and_connection_subscriptions_reach_engines(bus: Bus) -> None:
    engine = _attached(bus)

    def on_open(conn: Any) -> None:
        conn.subscribe("/direct")
        conn.subscribe("/cb", callback=lambda ch, data: None)

    app = GubleApp(bus=bus, user_id_lookup=lambda scope: "u", application_id_lookup=lambda scope: "a", on_open=on_open)
    seen: list[Any] = []

    def done(received: list[str]) -> bool:
        if "#ok-subscribed-to /foo" not in received:
            return False
        seen.append(list(engine.calls))
        return True

    drive(app, "/stream/", ["+ /foo"], done)
    app.close()
    assert sorted(seen[0]) == sorted(
        [
            ("sub", "/user/u/a", False),
            ("sub", "/user/u/a/**", True),
            ("sub", "/user/u/common", False),
            ("sub", "/user/u/common/**", True),
            ("sub", "/direct", False),
            ("sub", "/cb", False),
            ("sub", "/foo", False),
            ("sub", "/foo/**", True),
        ]
    )
    assert sorted(c for c in engine.calls if c[0] == "unsub") == sorted(("unsub", t, p) for _s, t, p in seen[0])
    assert bus.engines.subscribed() == {}


def test_bus_prefix_subscription_is_told_to_engines_as_channel_and_glob(bus: Bus) -> None:
    engine = _attached(bus)
    sub = bus.subscribe("/chat", lambda m: None, pattern="prefix")
    assert engine.calls == [("sub", "/chat", False), ("sub", "/chat/**", True)]
    bus.unsubscribe("/chat", sub, pattern="prefix")
    assert engine.calls[2:] == [("unsub", "/chat", False), ("unsub", "/chat/**", True)]
