"""``subscribe_allowed`` on SSE, ASGI and WSGI, in-process: a channel the client names and the hook refuses is
left out of the stream (an ``event: refused`` first; a 403 when nothing else was asked for); a pattern's channels
are asked about one by one, so a refused one delivers nothing live or replayed while the allowed ones keep their
order, also when the hook is ``async`` and its verdicts arrive later. The sink's holding of messages that wait
for a verdict is pinned here too. WebSocket, guble and REST: test_subscribe_allowed_ws.py."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from shmbus import Bus
from shmbus.adapters.http import MessageBusProtocol, RequestInfo
from shmbus.adapters.transports.gate import ChannelGate
from shmbus.adapters.transports.identity import Identity
from shmbus.adapters.transports.sink import Sink
from shmbus.adapters.transports.sse import SSEApp
from shmbus.adapters.transports.sse_wsgi import SSEWSGIApp

from .transport_util import Recorder, http_scope


def refuses_private(info: RequestInfo, channel: str) -> bool:
    return "private" not in channel.split("/")


async def refuses_private_later(info: RequestInfo, channel: str) -> bool:
    await asyncio.sleep(0.01)  # the verdict arrives after later messages: they must wait behind it
    return "private" not in channel.split("/")


def events(body: bytes) -> list[tuple[str | None, Any]]:
    """(event name, data) of each event; a message's name is its channel (``events=message``: None)."""
    out = []
    for block in body.decode().split("\n\n"):
        name, data = None, None
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
        if data is not None:
            out.append((name, data))
    return out


def channels(body: bytes) -> list[str]:
    return [d["channel"] for _, d in events(body) if isinstance(d, dict) and "channel" in d]


def seed(bus: Bus) -> None:
    for ch in ("/open", "/private/board", "/room/open", "/room/private", "/room/new"):
        bus.publish(ch, f"old {ch}")


async def run_sse(
    app: SSEApp, query: bytes, live: list[str], until: Callable[[bytes], bool], resume: bool = True
) -> tuple[int, bytes]:
    """One stream, in-process: once it has started, ``live`` channels are published to (in order); it ends when
    ``until(body)`` holds."""
    rec = Recorder()
    gone = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await gone.wait()
        return {"type": "http.disconnect"}

    headers = [(b"last-event-id", f"{app.bus.epoch}:0".encode())] if resume else []
    task = asyncio.ensure_future(app(http_scope("/sse", query, headers=headers), receive, rec))
    deadline = time.monotonic() + 20
    published = False
    while not task.done():
        if rec.body_sends and not published:
            published = True
            for ch in live:
                app.bus.publish(ch, f"live {ch}")
        if published and until(rec.body()):
            break
        assert time.monotonic() < deadline, rec.body()
        await asyncio.sleep(0.005)
    gone.set()
    await asyncio.wait_for(task, 20)
    app.close()
    return rec.start()["status"], rec.body()


def test_asgi_refused_channel_is_left_out_and_told_first(bus: Bus) -> None:
    seed(bus)
    app = SSEApp(bus=bus, subscribe_allowed=refuses_private)
    status, body = asyncio.run(
        run_sse(app, b"channel=/open&channel=/private/board", ["/private/board", "/open"], lambda b: b"live /open" in b)
    )
    assert status == 200
    got = events(body)
    assert got[0] == ("refused", {"channels": ["/private/board"]})
    assert channels(body) == ["/open", "/open"] and b"/private/board" not in body.split(b"\n\n", 2)[-1]
    assert [d["data"] for _, d in got[1:]] == ["old /open", "live /open"]


@pytest.mark.parametrize("hook", [refuses_private, refuses_private_later], ids=["plain", "async"])
def test_asgi_pattern_channels_are_asked_one_by_one_and_keep_their_order(bus: Bus, hook: Any) -> None:
    seed(bus)
    asked: list[str] = []

    def counting(info: RequestInfo, channel: str) -> Any:
        asked.append(channel)
        return hook(info, channel)

    app = SSEApp(bus=bus, subscribe_allowed=counting)
    live = ["/room/private", "/room/open", "/room/private", "/room/later", "/room/open"]
    status, body = asyncio.run(
        run_sse(app, b"prefix=/room&events=message", live, lambda b: b.count(b"live /room/open") == 2)
    )
    assert status == 200
    assert [d["data"] for _, d in events(body)] == [
        "old /room/open",
        "old /room/new",
        "live /room/open",
        "live /room/later",
        "live /room/open",
    ]
    assert sorted(asked) == ["/room/later", "/room/new", "/room/open", "/room/private"], "once per channel"


def test_asgi_nothing_but_refused_channels_is_403(bus: Bus) -> None:
    app = SSEApp(bus=bus, subscribe_allowed=refuses_private)
    rec = Recorder()

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    asyncio.run(app(http_scope("/sse", b"channel=/private/board"), receive, rec))
    assert rec.start()["status"] == 403 and rec.body() == b"not allowed to subscribe to /private/board"
    assert app.hub.connections() == 0 and bus.engines.subscribed() == {}
    app.close()


def test_asgi_server_side_subscriptions_are_gated_too(bus: Bus) -> None:
    def on_open(conn: Any) -> None:
        conn.subscribe("/private/board")
        conn.subscribe("/open")

    app = SSEApp(bus=bus, subscribe_allowed=refuses_private, on_open=on_open)
    status, body = asyncio.run(run_sse(app, b"", ["/private/board", "/open"], lambda b: b"live /open" in b))
    assert status == 200 and channels(body) == ["/open"]


# ---------------------------------------------------------------------------------------------------- WSGI
def wsgi_stream(app: SSEWSGIApp, query: str) -> tuple[str, Any]:
    got: list[str] = []
    environ = {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": "/sse",
        "QUERY_STRING": query,
        "HTTP_LAST_EVENT_ID": f"{app.bus.epoch}:0",
        "wsgi.multithread": True,
    }
    response = app(environ, lambda status, headers: got.append(status))
    return got[0], response


def test_wsgi_exact_and_pattern_channels(bus: Bus) -> None:
    seed(bus)
    app = SSEWSGIApp(bus=bus, keepalive_interval=1, subscribe_allowed=refuses_private)
    status, response = wsgi_stream(app, "channel=/open&channel=/private/board&prefix=/room&events=message")
    assert status.startswith("200")
    pieces = iter(response)
    body = next(pieces)
    for ch in ("/private/board", "/room/private", "/open", "/room/open"):
        bus.publish(ch, f"live {ch}")
    deadline = time.monotonic() + 20
    while b"live /room/open" not in body:
        assert time.monotonic() < deadline, body
        body += next(pieces)
    response.close()
    app.close()
    got = events(body)
    assert got[0] == ("refused", {"channels": ["/private/board"]})
    assert [d["data"] for _, d in got[1:]] == [
        "old /open",
        "old /room/open",
        "old /room/new",
        "live /open",
        "live /room/open",
    ]


def test_wsgi_nothing_but_refused_is_403_and_an_async_hook_is_never_a_yes(bus: Bus) -> None:
    app = SSEWSGIApp(bus=bus, subscribe_allowed=refuses_private)
    status, response = wsgi_stream(app, "channel=/private/board")
    assert status.startswith("403") and b"".join(response) == b"not allowed to subscribe to /private/board"
    app.close()
    app = SSEWSGIApp(bus=bus, subscribe_allowed=refuses_private_later)
    with pytest.raises(TypeError, match="awaitable"):
        wsgi_stream(app, "channel=/open")
    assert app.stats()["connections"] == 0
    app.close()


# ---------------------------------------------------------------------------------------------------- the sink
def sink_with(bus: Bus, hook: Any) -> Sink:
    identity = Identity("c1", MessageBusProtocol.lookups(7, None, None))
    gate = ChannelGate(hook, RequestInfo({}, "c1", 7))
    sink = Sink(bus, identity, lambda m: f"{m.channel}:{m.data}", gate=gate)
    sink.add_pattern("/room", "prefix", 0)
    return sink


def test_a_hook_that_raises_refuses_that_channel_only(bus: Bus) -> None:
    def hook(info: RequestInfo, channel: str) -> bool:
        if channel == "/room/broken":
            raise RuntimeError("no session")
        return True

    sink = sink_with(bus, hook)
    for ch in ("/room/broken", "/room/ok"):
        bus.publish(ch, 1)
        sink.offer(bus.backlog(ch, 0)[0])
    assert sink.take() == ["/room/ok:1"]


def test_held_messages_wait_in_order_and_a_hook_that_never_answers_drops_the_connection(bus: Bus) -> None:
    release = threading.Event()

    async def slow(info: RequestInfo, channel: str) -> bool:
        while not release.is_set():
            await asyncio.sleep(0.005)
        return channel != "/room/no"

    async def main() -> None:
        sink = sink_with(bus, slow)
        for ch in ("/room/a", "/room/no", "/room/a"):
            bus.publish(ch, ch)
            sink.offer(bus.backlog(ch, 0)[-1])
        sink.push("a control frame")
        assert sink.take() == [] and len(sink.held) == 4
        release.set()
        for _ in range(1000):
            if not sink.held:
                break
            await asyncio.sleep(0.005)
        assert sink.take() == ["/room/a:/room/a", "/room/a:/room/a", "a control frame"]
        release.clear()
        stuck = sink_with(bus, slow)
        stuck.MAX_HELD = 3
        for _ in range(4):
            stuck.offer(bus.backlog("/room/a", 0)[-1])
        assert stuck.dropped and not stuck.held
        assert stuck.gate is not None
        stuck.gate.close()
        assert not stuck.gate.asking

    asyncio.run(main())
