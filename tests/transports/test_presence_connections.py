"""Presence of WebSocket and SSE connections, in-process: a connection is present on the channels it subscribes (not on
one ``subscribe_allowed`` refused, nor on a pattern), and leaves when it unsubscribes or closes. The poll side and
real gunicorn workers: tests/web/test_presence_servers.py; the sans-IO parts: tests/core/test_presence.py."""

from __future__ import annotations

import json
from typing import Any

from shmbus import Bus
from shmbus.adapters.http import RequestInfo
from shmbus.adapters.transports.sse_wsgi import SSEWSGIApp
from shmbus.adapters.transports.websocket import WebSocketApp
from tests.harness.wait import wait_for

from .transport_util import drive


def refuses_private(info: RequestInfo, channel: str) -> bool:
    return "private" not in channel.split("/")


def names(bus: Bus, channel: str) -> list[str]:
    return [m.client_id for m in bus.presence(channel)]


def test_a_websocket_is_present_while_it_holds_a_channel(bus: Bus) -> None:
    assert bus.presence("/open") == []  # the view is ready (its first call waits one heartbeat)
    app = WebSocketApp(
        bus=bus,
        subscribe_allowed=refuses_private,
        client_id_lookup=lambda scope: "sock1",
        presence=True,
        presence_grace=0,
    )
    commands = [
        {"op": "subscribe", "channel": "/private/board", "ref": 1},
        {"op": "subscribe", "channel": "/open", "ref": 2},
        {"op": "subscribe", "channel": "/other", "ref": 3},
        {"op": "subscribe", "pattern": "/room", "kind": "prefix", "ref": 4},
    ]
    seen: dict[str, Any] = {}

    def check(received: list[str]) -> None:
        if "open" not in seen and any('"ref":4' in f for f in received):
            seen["open"] = wait_for(lambda: names(bus, "/open"), 10, "the socket present on /open")
            seen["other"] = names(bus, "/other")
            seen["private"] = names(bus, "/private/board")
            seen["room"] = names(bus, "/room")

    drive(app, "/ws", [json.dumps(c) for c in commands], lambda r: "open" in seen, between=check)
    assert seen == {"open": ["sock1"], "other": ["sock1"], "private": [], "room": []}
    # the connection closed: gone (grace 0) at the next announcement
    wait_for(lambda: names(bus, "/open") == [] and names(bus, "/other") == [], 10, "the socket gone")
    app.close()


def test_an_sse_stream_is_present_until_it_closes(bus: Bus) -> None:
    assert bus.presence("/open") == []  # the view is ready
    app = SSEWSGIApp(bus=bus, keepalive_interval=1, subscribe_allowed=refuses_private, presence=["/open", "/priv"])
    environ = {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": "/sse",
        "QUERY_STRING": "client_id=tab1&channel=/open&channel=/private/board&channel=/elsewhere",
        "wsgi.multithread": True,
    }
    response = app(environ, lambda status, headers: None)
    next(iter(response))  # the stream is open
    wait_for(lambda: names(bus, "/open") == ["tab1"], 10, "the stream present on /open")
    assert names(bus, "/private/board") == [] and names(bus, "/elsewhere") == []  # refused; not covered
    response.close()
    app.close()
    wait_for(lambda: names(bus, "/open") == [], 30, "the stream gone (after the 5 s grace)")
