"""WebSocket transport: real uvicorn + the ``websockets`` client; publishes from another process; replay by id and
count, publish permission, targeting, resets, bad input and slow clients."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from shmbus import Bus
from shmbus.adapters.transports.websocket import WebSocketApp
from tests.harness import skip_or_fail

from .transport_util import Recorder

try:
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import ClientConnection, connect
except ImportError:  # pragma: no cover
    connect = None  # type: ignore[assignment]

END = "/end"


class WS:
    """A sync websockets connection with JSON helpers."""

    def __init__(self, conn: ClientConnection) -> None:
        self.conn = conn

    def send(self, obj: Any) -> None:
        self.conn.send(obj if isinstance(obj, (str, bytes)) else json.dumps(obj))

    def recv(self, timeout: float = 20.0) -> Any:
        return json.loads(self.conn.recv(timeout=timeout))

    def until(self, pred: Callable[[Any], bool], timeout: float = 30.0) -> list[Any]:
        """Frames up to and including the first one matching ``pred``."""
        out = []
        deadline = time.monotonic() + timeout
        while True:
            f = self.recv(max(deadline - time.monotonic(), 0.1))
            out.append(f)
            if pred(f):
                return out

    def request(self, obj: dict[str, Any]) -> list[Any]:
        """Send a command with a ref; frames up to its status/error/pong."""
        ref = f"r{time.monotonic_ns()}"
        self.send({**obj, "ref": ref})
        return self.until(lambda f: f.get("ref") == ref)


def on(channel: str) -> Callable[[Any], bool]:
    return lambda f: f.get("channel") == channel and "op" not in f


def datas(frames: list[Any]) -> list[Any]:
    return [f["data"] for f in frames if "op" not in f]


@pytest.fixture
def ws_connect(server: Any) -> Iterator[Callable[..., WS]]:
    if connect is None:
        skip_or_fail("the websockets package is not installed (pip install websockets)")
    stack = contextlib.ExitStack()
    state: dict[str, Any] = {}

    def open_(query: str = "", headers: dict[str, str] | None = None, **env: str) -> WS:
        if "srv" not in state:
            state["srv"] = server(**env)
        url = f"ws://127.0.0.1:{state['srv'].port}/ws{query}"
        ws = WS(stack.enter_context(connect(url, additional_headers=headers or {}, open_timeout=15, proxy=None)))
        hello = ws.recv()
        assert hello["op"] == "status" and hello["status"] == "connected"
        return ws

    with stack:
        yield open_


def test_cross_process_subscribe_patterns_unsubscribe(bus: Bus, ws_connect: Any, publisher: Any, bus_name: str) -> None:
    ws = ws_connect()
    assert ws.request({"op": "subscribe", "channel": "/a"})[-1]["status"] == "subscribed"
    assert ws.request({"op": "subscribe", "pattern": "/tree"})[-1]["kind"] == "prefix"
    assert ws.request({"op": "subscribe", "pattern": "/g/*", "kind": "glob"})[-1]["status"] == "subscribed"
    ws.request({"op": "subscribe", "channel": END})
    publisher(
        bus_name,
        [
            ("/a", 1),
            ("/b", "no"),
            ("/tree", 2),
            ("/tree/x/y", 3),
            ("/treeX", "no"),
            ("/g/1", 4),
            ("/g/1/2", "no"),
            (END, "end"),
        ],
    )
    frames = ws.until(on(END))
    assert datas(frames) == [1, 2, 3, 4, "end"]
    first = frames[0]
    assert set(first) == {"global_id", "message_id", "channel", "data"}
    assert first["channel"] == "/a" and first["message_id"] == 1
    assert first["global_id"] == bus.backlog("/a", 0)[0].global_id
    st = ws.request({"op": "unsubscribe", "channel": "/a"})[-1]
    assert st["status"] == "unsubscribed" and st["removed"] is True
    ws.request({"op": "unsubscribe", "pattern": "/tree", "kind": "prefix"})
    publisher(bus_name, [("/a", "gone"), ("/tree/z", "gone"), ("/g/2", 5), (END, "end2")])
    assert datas(ws.until(on(END))) == [5, "end2"]


def test_subscribe_with_last_id_replays_then_live_without_duplicates(
    bus: Bus, ws_connect: Any, publisher: Any, bus_name: str
) -> None:
    for i in range(1, 6):
        bus.publish("/r", i)
    ws = ws_connect()
    frames = ws.request({"op": "subscribe", "channel": "/r", "last_id": 3})
    assert datas(frames) == [4, 5]
    assert frames[-1]["last_id"] == 5 and frames[-1]["gap"] is False
    ws.request({"op": "subscribe", "channel": END})
    publisher(bus_name, [("/r", 6), (END, "end")])
    assert datas(ws.until(on(END))) == [6, "end"]
    # guble-style negative id: the last 2 messages first
    ws2 = ws_connect()
    assert datas(ws2.request({"op": "subscribe", "channel": "/r", "last_id": -2})) == [5, 6]
    # a pattern subscription replays by global id
    g = bus.backlog("/r", 0)[3].global_id  # after message 4
    frames = ws2.request({"op": "subscribe", "pattern": "/r", "last_global_id": g})
    assert datas(frames) == [5, 6] and frames[-1]["gap"] is False


def test_replay_with_start_id_and_count(bus: Bus, ws_connect: Any, publisher: Any, bus_name: str) -> None:
    for i in range(1, 11):
        bus.publish("/q", i)
    ws = ws_connect()
    frames = ws.request({"op": "replay", "channel": "/q", "start_id": 3, "count": 4})
    assert datas(frames) == [3, 4, 5, 6]
    assert frames[-1]["status"] == "replayed" and frames[-1]["count"] == 4 and frames[-1]["last_id"] == 6
    assert datas(ws.request({"op": "replay", "channel": "/q", "start_id": -3})) == [8, 9, 10]
    assert datas(ws.request({"op": "replay", "channel": "/q", "start_id": 0, "count": 2})) == [1, 2]
    # a replay does not subscribe
    ws.request({"op": "subscribe", "channel": END})
    publisher(bus_name, [("/q", 11), (END, "end")])
    assert datas(ws.until(on(END))) == ["end"]


def test_publish_only_when_allowed(bus: Bus, ws_connect: Any) -> None:
    ws = ws_connect(headers={"x-user": "5"})
    other = ws_connect(headers={"x-user": "6"})
    for w in (ws, other):
        w.request({"op": "subscribe", "pattern": "/pub"})
    seen = ws.request({"op": "publish", "channel": "/pub/x", "data": {"hi": 1}})
    assert seen[-1] == {
        "op": "status",
        "status": "published",
        "channel": "/pub/x",
        "message_id": 1,
        "ref": seen[-1]["ref"],
    }
    assert bus.backlog("/pub/x", 0)[0].data == {"hi": 1}
    seen += ws.request({"op": "publish", "channel": "/secret", "data": 1})
    assert seen[-1]["op"] == "error" and "not allowed" in seen[-1]["reason"]
    assert bus.last_id("/secret") == 0
    # targeted publish reaches only its target
    seen += ws.request({"op": "publish", "channel": "/pub/x", "data": "for-6", "user_ids": [6]})
    seen += ws.request({"op": "publish", "channel": "/pub/x", "data": "all"})
    assert datas(other.until(lambda f: f.get("data") == "all")) == [{"hi": 1}, "for-6", "all"]
    if "all" not in datas(seen):
        seen += ws.until(lambda f: f.get("data") == "all")
    assert datas(seen) == [{"hi": 1}, "all"]


def test_publish_disabled_without_callback(bus: Bus) -> None:
    app = WebSocketApp(bus=bus)
    frames = _run_ws(app, [{"op": "publish", "channel": "/pub/x", "data": 1}])
    app.close()
    assert frames[-1]["op"] == "error" and "disabled" in frames[-1]["reason"]
    assert bus.last_id("/pub/x") == 0


BAD_FRAMES: list[tuple[Any, str]] = [
    ("{not json", "invalid JSON"),
    ("[1,2]", "JSON object"),
    ({"op": "frobnicate"}, "unknown op"),
    ({"nop": 1}, "missing or non-string 'op'"),
    ({"op": "subscribe"}, "exactly one of"),
    ({"op": "subscribe", "channel": "/a", "pattern": "/b"}, "exactly one of"),
    ({"op": "subscribe", "channel": "nope"}, "must start with '/'"),
    ({"op": "subscribe", "channel": "/a", "last_id": "7"}, "last_id must be an integer"),
    ({"op": "subscribe", "channel": "/a", "last_id": True}, "last_id must be an integer"),
    ({"op": "subscribe", "pattern": "/a", "kind": "regex"}, "kind must be"),
    ({"op": "subscribe", "channel": "/__mb_keepalive__/"}, "reserved"),
    ({"op": "replay", "pattern": "/a"}, "needs a 'channel'"),
    ({"op": "replay", "channel": "/a", "count": 0}, "count must be"),
    ({"op": "publish", "channel": "/pub/x"}, "needs 'data'"),
    ({"op": "publish", "channel": "/pub/x", "data": 1, "user_ids": []}, "non-empty list"),
    ({"op": "publish", "channel": "/global/pub/x", "data": 1, "user_ids": [1]}, "not allowed"),
    ({"op": "publish", "channel": "/pub/x", "data": 1, "user_ids": [1], "ref": ["x"]}, "ref must be"),
    (b"\xff\xfe", "not valid UTF-8"),
]


def test_bad_input_gets_error_frames_and_connection_survives(bus: Bus, ws_connect: Any) -> None:
    ws = ws_connect()
    for frame, reason in BAD_FRAMES:
        ws.send(frame)
        reply = ws.recv()
        assert reply["op"] == "error", (frame, reply)
        assert reason in reply["reason"], (frame, reply)
    assert ws.request({"op": "ping"})[-1]["op"] == "pong"
    assert bus.last_id("/pub/x") == 0 and bus.last_id("/global/pub/x") == 0
    ws.send("x" * 70_000)  # over max_frame: said, then closed with 1009 (test_websocket_frame_limit.py)
    assert "message too big" in ws.recv()["reason"]
    with pytest.raises(ConnectionClosed) as info:
        ws.recv()
    assert info.value.rcvd is not None and info.value.rcvd.code == 1009


def test_invalid_client_id_refused(bus: Bus, server: Any) -> None:
    if connect is None:
        skip_or_fail("the websockets package is not installed (pip install websockets)")
    srv = server()
    with connect(f"ws://127.0.0.1:{srv.port}/ws?client_id=bad%20id", open_timeout=15, proxy=None) as conn:
        first = json.loads(conn.recv(timeout=20))
        assert first["op"] == "error" and "invalid client id" in first["reason"]
        with pytest.raises(ConnectionClosed) as info:
            conn.recv(timeout=20)
    assert info.value.rcvd is not None and info.value.rcvd.code == 1008


def test_targeting_never_leaks(bus: Bus, ws_connect: Any, publisher: Any, bus_name: str) -> None:
    a = ws_connect(headers={"x-user": "1"})
    b = ws_connect(headers={"x-user": "2", "x-groups": "7"})
    c = ws_connect(query="?client_id=tab-c")
    d = ws_connect(headers={"x-user": "1", "x-site": "s1"})
    for w in (a, b, c, d):
        w.request({"op": "subscribe", "channel": "/t"})
        w.request({"op": "subscribe", "pattern": "/tp"})
        w.request({"op": "subscribe", "channel": "/global/end"})
    publisher(
        bus_name,
        [
            ("/t", "u1", {"user_ids": [1]}),
            ("/tp/x", "g7", {"group_ids": [7]}),
            ("/t", "tab-c", {"client_ids": ["tab-c"]}),
            ("/tp/y", "u2", {"user_ids": [2]}),
            ("/t", "s1", {"site_id": "s1"}),
            ("/tp", "u1-s1", {"user_ids": [1], "site_id": "s1"}),
            ("/t", "all"),
            ("/global/end", "end"),
        ],
    )
    assert datas(a.until(on("/global/end"))) == ["u1", "all", "end"]
    assert datas(b.until(on("/global/end"))) == ["g7", "u2", "all", "end"]
    assert datas(c.until(on("/global/end"))) == ["tab-c", "all", "end"]
    assert datas(d.until(on("/global/end"))) == ["s1", "u1-s1", "end"]
    # replays apply the same rules
    assert datas(b.request({"op": "replay", "channel": "/t"})) == ["all"]
    assert datas(a.request({"op": "subscribe", "channel": "/t", "last_id": 0})) == ["u1", "all"]


def test_live_reset_reported_and_new_epoch_delivered_once(
    bus: Bus, ws_connect: Any, publisher: Any, bus_name: str
) -> None:
    ws = ws_connect()
    ws.request({"op": "subscribe", "channel": "/e"})
    ws.request({"op": "subscribe", "channel": END})
    old = bus.epoch
    bus.reset()
    publisher(bus_name, [("/e", "new-1"), (END, "end")])
    frames = ws.until(on(END))
    assert frames[0]["op"] == "status" and frames[0]["status"] == "reset"
    assert frames[0]["previous_epoch"] == old and frames[0]["epoch"] == bus.epoch != old
    assert datas(frames) == ["new-1", "end"]


def _run_ws(
    app: WebSocketApp,
    commands: list[Any],
    rec: Recorder | None = None,
    until: Callable[[], bool] | None = None,
    publish: Callable[[int], None] | None = None,
) -> list[Any]:
    """Drive the app in-process: connect, send ``commands``, keep the socket open until ``until()``."""
    rec = rec or Recorder()

    async def main() -> None:
        inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        await inbox.put({"type": "websocket.connect"})
        for c in commands:
            await inbox.put({"type": "websocket.receive", "text": json.dumps(c)})

        async def receive() -> dict[str, Any]:
            return await inbox.get()

        scope = {"type": "websocket", "path": "/ws", "root_path": "", "query_string": b"", "headers": []}
        task = asyncio.ensure_future(app(scope, receive, rec))
        deadline = time.monotonic() + 20
        i = 0
        while not (until() if until else len(rec.messages) >= len(commands) + 2):
            assert time.monotonic() < deadline, "timed out"
            if publish is not None:
                publish(i)
                i += 1
            await asyncio.sleep(0.002)
        if not task.done():
            await inbox.put({"type": "websocket.disconnect", "code": 1000})
        await asyncio.wait_for(task, 20)

    asyncio.run(main())
    return [json.loads(m["text"]) for m in rec.messages if m["type"] == "websocket.send"]


def test_slow_client_dropped_in_process(bus: Bus) -> None:
    app = WebSocketApp(bus=bus, max_buffer=32 * 1024)
    rec = Recorder(block_after=2)  # "connected" and "subscribed" go out, then the client stops reading
    _run_ws(
        app,
        [{"op": "subscribe", "channel": "/slow"}],
        rec,
        until=lambda: app.stats()["dropped"] == 1,
        publish=lambda i: bus.publish("/slow", "z" * 3000 + str(i)),
    )
    app.close()
    assert rec.blocked
    closes = [m for m in rec.messages if m["type"] == "websocket.close"]
    assert closes and closes[0]["code"] == 1008
    assert app.stats() == {"connections": 0, "dropped": 1}


def test_late_batch_never_repeats_replayed_messages(bus: Bus) -> None:
    for i in (1, 2, 3):
        bus.publish("/d", i)
    app = WebSocketApp(bus=bus)
    state = {"n": 0}

    def step(_i: int) -> None:
        if state["n"] == 0 and any('"subscribed"' in m.get("text", "") for m in rec.messages):
            next(iter(app.hub._loops.values())).dispatch(list(bus.backlog("/d", 0)))  # a late batch
            bus.publish("/d", 4)
            state["n"] = 1

    rec = Recorder()
    frames = _run_ws(
        app,
        [{"op": "subscribe", "channel": "/d", "last_id": 0}],
        rec,
        until=lambda: any('"data":4' in m.get("text", "") for m in rec.messages),
        publish=step,
    )
    app.close()
    assert datas(frames) == [1, 2, 3, 4]


def test_slow_client_dropped_by_real_server(bus: Bus, server: Any, publisher: Any, bus_name: str) -> None:
    """A websockets client with a one-frame queue stops reading its socket; the server closes it, others live on."""
    if connect is None:
        skip_or_fail("the websockets package is not installed (pip install websockets)")
    import httpx

    srv = server(SHMBUS_TEST_MAX_BUFFER=str(64 * 1024))

    def stats() -> dict[str, Any]:
        return httpx.get(srv.url + "/stats", timeout=10, trust_env=False).json()["ws"]  # type: ignore[no-any-return]

    with connect(f"ws://127.0.0.1:{srv.port}/ws", open_timeout=15, proxy=None, max_queue=1) as conn:
        conn.send(json.dumps({"op": "subscribe", "channel": "/slow"}))
        assert json.loads(conn.recv(timeout=20))["status"] == "connected"
        assert json.loads(conn.recv(timeout=20))["status"] == "subscribed"
        blob = "w" * 20_000
        for _ in range(40):  # up to ~20 MB; stop once dropped
            publisher(bus_name, [("/slow", blob)] * 25)
            if stats()["dropped"]:
                break
        deadline = time.monotonic() + 20
        while stats() != {"connections": 0, "dropped": 1}:
            assert time.monotonic() < deadline, stats()
            time.sleep(0.05)
    with connect(f"ws://127.0.0.1:{srv.port}/ws", open_timeout=15, proxy=None) as other:
        assert json.loads(other.recv(timeout=20))["status"] == "connected"


def test_index_follows_subscriptions(bus: Bus) -> None:
    """Unsubscribing and disconnecting leave nothing behind in the per-loop channel index (bounded memory)."""
    app = WebSocketApp(bus=bus)
    rec = Recorder()
    seen: list[Any] = []

    def check() -> bool:
        if sum('"unsubscribed"' in m.get("text", "") for m in rec.messages) < 2:
            return False
        (h,) = app.hub._loops.values()
        seen.append((dict(h.by_channel), set(h.pattern_sinks), len(h.sinks)))
        return True

    _run_ws(
        app,
        [
            {"op": "subscribe", "channel": "/i"},
            {"op": "subscribe", "pattern": "/p"},
            {"op": "subscribe", "channel": "/j"},
            {"op": "unsubscribe", "channel": "/i"},
            {"op": "unsubscribe", "pattern": "/p"},
        ],
        rec,
        until=check,
    )
    (h,) = app.hub._loops.values()
    app.close()
    by_channel, pattern_sinks, n = seen[0]
    assert list(by_channel) == ["/j"] and pattern_sinks == set() and n == 1
    assert h.by_channel == {} and h.sinks == set() and h.pattern_sinks == set()
