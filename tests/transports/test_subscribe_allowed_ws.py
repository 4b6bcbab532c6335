"""``subscribe_allowed`` on the WebSocket app, guble and REST publish, in-process: subscribing to or replaying a
refused channel gets an error frame (``!error-subscribed-to`` on guble) and delivers nothing, a pattern's refused
channels deliver nothing live or replayed, and a publish answer leaves out the id of a channel the publisher may
not read. SSE and the sink: test_subscribe_allowed_sse.py."""

from __future__ import annotations

import asyncio
import io
import json
from typing import Any

import pytest

from shmbus import Bus
from shmbus.adapters.guble import GubleApp
from shmbus.adapters.http import RequestInfo
from shmbus.adapters.transports.rest import AsgiRestPublish, WsgiRestPublish
from shmbus.adapters.transports.websocket import WebSocketApp

from .transport_util import Recorder, drive, http_scope


def refuses_private(info: RequestInfo, channel: str) -> bool:
    return "private" not in channel.split("/")


async def refuses_private_async(info: RequestInfo, channel: str) -> bool:
    await asyncio.sleep(0.005)
    return "private" not in channel.split("/")


HOOKS = pytest.mark.parametrize("hook", [refuses_private, refuses_private_async], ids=["plain", "async"])


def seed(bus: Bus) -> None:
    for ch in ("/open", "/private/board", "/room/open", "/room/private"):
        bus.publish(ch, f"old {ch}")


def ws_messages(frames: list[str]) -> list[tuple[str, Any]]:
    return [(m["channel"], m["data"]) for m in map(json.loads, frames) if "channel" in m and "op" not in m]


@HOOKS
def test_websocket_refuses_a_channel_and_filters_a_pattern(bus: Bus, hook: Any) -> None:
    seed(bus)
    app = WebSocketApp(bus=bus, allow_publish=lambda scope, ch: True, subscribe_allowed=hook)
    commands = [
        {"op": "subscribe", "channel": "/private/board", "last_id": 0, "ref": 1},
        {"op": "replay", "channel": "/private/board", "ref": 2},
        {"op": "subscribe", "channel": "/open", "last_id": 0, "ref": 3},
        {"op": "subscribe", "pattern": "/room", "kind": "prefix", "last_global_id": 0, "ref": 4},
        {"op": "publish", "channel": "/private/board", "data": "from the socket", "ref": 5},
        {"op": "publish", "channel": "/open", "data": "from the socket", "ref": 6},
    ]
    live = {"done": False}

    def publish(received: list[str]) -> None:
        if not live["done"] and any('"ref":6' in f for f in received):
            live["done"] = True
            for ch in ("/private/board", "/room/private", "/open", "/room/open"):
                bus.publish(ch, f"live {ch}")

    got = drive(
        app, "/ws", [json.dumps(c) for c in commands], lambda r: any("live /room/open" in f for f in r), between=publish
    )
    app.close()
    replies = {m.get("ref"): m for m in map(json.loads, got) if m.get("op") in ("error", "status")}
    for ref in (1, 2):
        assert replies[ref]["op"] == "error" and replies[ref]["channel"] == "/private/board"
        assert replies[ref]["reason"] == "not allowed to subscribe to '/private/board'"
    assert replies[3]["status"] == "subscribed" and replies[4]["status"] == "subscribed"
    assert replies[5] == {"op": "status", "status": "published", "channel": "/private/board", "ref": 5}
    assert replies[6]["message_id"] == 2
    assert ws_messages(got) == [
        ("/open", "old /open"),
        ("/room/open", "old /room/open"),
        ("/open", "from the socket"),
        ("/open", "live /open"),
        ("/room/open", "live /room/open"),
    ]
    assert "private" not in "".join(f for f in got if '"ref"' not in f)


@HOOKS
def test_guble_refuses_reads_of_a_topic_and_filters_subtopics(bus: Bus, hook: Any) -> None:
    seed(bus)
    bus.publish("/room/private/deeper", "old deeper")
    app = GubleApp(bus=bus, allow_send=lambda scope, path: True, subscribe_allowed=hook)
    commands = ["+ /private/board", "+ /private/board 0", "replay -1 /private/board", "+ /room", "+ /open 0"]
    commands += ["> /private/board m1\n\nsent", "> /open m2\n\nsent"]
    live = {"done": False}

    def publish(received: list[str]) -> None:
        if not live["done"] and any(f.startswith("#ok-send m2") for f in received):
            live["done"] = True
            for ch in ("/room/private", "/room/private/deeper", "/private/board", "/room/open"):
                bus.publish(ch, f"live {ch}")

    got = drive(app, "/stream/", commands, lambda r: any("live /room/open" in f for f in r), between=publish)
    app.close()
    refusal = '!error-subscribed-to /private/board\n{"reason": "not allowed to subscribe to /private/board"}'
    assert got.count(refusal) == 3
    sends = {f.split()[1]: json.loads(f.split("\n", 1)[1]) for f in got if f.startswith("#ok-send")}
    assert sends["m1"]["sequenceId"] == "" and sends["m2"]["sequenceId"] == "2"
    bodies = [(f.split(",", 1)[0], f.rsplit("\n", 1)[1]) for f in got if f.startswith("/")]
    assert bodies == [("/open", "old /open"), ("/open", "sent"), ("/room/open", "live /room/open")]


def test_guble_rest_hides_the_sequence_id_of_a_topic_the_caller_may_not_read(bus: Bus) -> None:
    app = GubleApp(bus=bus, authorize=lambda scope, ch: True, subscribe_allowed=refuses_private)
    answers = []
    for topic in ("/private/board", "/open"):
        rec = Recorder()

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"hi", "more_body": False}

        asyncio.run(app(http_scope(f"/api/message{topic}", method="POST"), receive, rec))
        assert rec.start()["status"] == 200
        answers.append(json.loads(rec.body())["sequenceId"])
    app.close()
    assert answers == ["", "1"]


@HOOKS
def test_asgi_rest_leaves_out_the_id_of_a_channel_the_caller_may_not_read(bus: Bus, hook: Any) -> None:
    seen: list[RequestInfo] = []

    def counting(info: RequestInfo, channel: str) -> Any:
        seen.append(info)
        return hook(info, channel)

    app = AsgiRestPublish(bus=bus, authorize=lambda scope, ch: True, subscribe_allowed=counting)
    answers = []
    for channel in ("/private/board", "/open"):
        rec = Recorder()

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"hi", "more_body": False}

        scope = http_scope(f"/message{channel}", method="POST")
        asyncio.run(app(scope, receive, rec))
        answers.append(json.loads(rec.body()))
    assert answers == [{"channel": "/private/board"}, {"channel": "/open", "message_id": 1}]
    assert bus.last_id("/private/board") == 1, "the publish itself went through"
    assert seen[0].request["path"] == "/message/private/board" and seen[0].user_id is None


def test_wsgi_rest_leaves_out_the_id_and_an_async_hook_is_never_a_yes(bus: Bus) -> None:
    def post(app: WsgiRestPublish, channel: str) -> Any:
        environ = {
            "REQUEST_METHOD": "POST",
            "PATH_INFO": f"/message{channel}",
            "QUERY_STRING": "",
            "CONTENT_LENGTH": "2",
            "wsgi.input": io.BytesIO(b"hi"),
        }
        return json.loads(b"".join(app(environ, lambda status, headers: None)))

    app = WsgiRestPublish(bus=bus, authorize=lambda env, ch: True, subscribe_allowed=refuses_private)
    assert post(app, "/private/board") == {"channel": "/private/board"}
    assert post(app, "/open") == {"channel": "/open", "message_id": 1}
    app = WsgiRestPublish(bus=bus, authorize=lambda env, ch: True, subscribe_allowed=refuses_private_async)
    with pytest.raises(TypeError, match="awaitable"):
        post(app, "/open")
