"""The browser-visible form of presence over a WebSocket, in-process: ``/__presence/<channel>`` is an ordinary
channel to a client, its first subscription brings a snapshot addressed to the client alone, joins and leaves
follow as ``change`` messages, and a view of a channel ``subscribe_allowed`` refuses is refused too (nothing of it
is sent); the same over SSE. The poll protocol with the npm client in Chromium: tests/e2e/test_presence_browser.py."""

from __future__ import annotations

import json
from typing import Any

from shmbus import Bus
from shmbus.adapters.http import RequestInfo
from shmbus.adapters.transports.websocket import WebSocketApp
from shmbus.presence import hub_for
from tests.harness.wait import wait_for

from .transport_util import drive


def refuses_private(info: RequestInfo, channel: str) -> bool:
    return "private" not in channel.split("/")


def frames_on(received: list[str], channel: str) -> list[Any]:
    out = []
    for text in received:
        frame = json.loads(text)
        if frame.get("channel") == channel and "data" in frame:
            out.append(frame["data"])
    return out


def test_a_websocket_reads_a_channels_presence_as_a_channel(bus: Bus) -> None:
    hub = hub_for(bus)
    hub.touch("alice", 7, ["/open"], lease=60)
    hub.touch("mallory", 9, ["/private/board"], lease=60)
    wait_for(lambda: [m.client_id for m in bus.presence("/open")] == ["alice"], 10, "alice present")
    app = WebSocketApp(bus=bus, subscribe_allowed=refuses_private, client_id_lookup=lambda scope: "watcher")
    commands = [
        {"op": "subscribe", "channel": "/__presence/private/board", "ref": 1},
        {"op": "subscribe", "channel": "/__presence/open", "ref": 2},
    ]
    state: dict[str, Any] = {}

    def between(received: list[str]) -> None:
        if "bob" not in state and frames_on(received, "/__presence/open"):
            state["bob"] = True
            hub.touch("bob", None, ["/open", "/private/board"], lease=60)

    def until(received: list[str]) -> bool:
        return len(frames_on(received, "/__presence/open")) >= 2

    received = drive(app, "/ws", [json.dumps(c) for c in commands], until, between=between)
    snapshot, change = frames_on(received, "/__presence/open")[:2]
    assert snapshot["type"] == "snapshot" and snapshot["channel"] == "/open"
    assert [(m[0], m[1]) for m in snapshot["members"]] == [("alice", 7)]
    assert change["type"] == "change" and change["leave"] == []
    assert [m[0] for m in change["join"]] == ["bob"]
    assert frames_on(received, "/__presence/private/board") == []
    assert not any("mallory" in text or '/private/board","data' in text for text in received)
    app.close()


def test_no_presence_entry_for_a_view_channel_and_no_view_of_a_reserved_channel(bus: Bus) -> None:
    from shmbus.adapters.http.options import Options
    from shmbus.presence.browser import watched

    assert Options(presence=True).presence_of(["/a", "/__presence/a"]) == ["/a"]
    assert watched("/__presence/a/b") == "/a/b"
    assert [watched(c) for c in ("/__presence/__status", "/__presence/", "/__presence//x", "/a")] == [None] * 4


def test_an_sse_stream_reads_a_view_and_nothing_of_a_refused_one(bus: Bus) -> None:
    from shmbus.adapters.transports.sse_wsgi import SSEWSGIApp

    hub = hub_for(bus)
    hub.touch("alice", 7, ["/open"], lease=60)
    hub.touch("mallory", 9, ["/private/board"], lease=60)
    wait_for(lambda: len(bus.presence("/open")) == 1 and len(bus.presence("/private/board")) == 1, 10, "both")
    app = SSEWSGIApp(bus=bus, keepalive_interval=1, subscribe_allowed=refuses_private)
    environ = {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": "/sse",
        "QUERY_STRING": "client_id=tab1&channel=/__presence/open&channel=/__presence/private/board",
        "wsgi.multithread": True,
    }
    response = app(environ, lambda status, headers: None)
    got = b""
    for piece in response:
        got += piece
        if b'"snapshot"' in got and b"\n\n" in got[got.index(b'"snapshot"') :]:
            break
    hub.touch("bob", None, ["/open", "/private/board"], lease=60)
    for piece in response:
        got += piece
        if b'"bob"' in got:
            break
    response.close()
    app.close()
    assert b'["alice",7,' in got.replace(b" ", b"") and b"mallory" not in got
    assert b'event: refused\ndata: {"channels": ["/__presence/private/board"]}' in got
    assert b"event: /__presence/private/board" not in got, "the refused view sent something"
    assert got.count(b'"bob"') == 1
