"""SSE transport: real uvicorn + httpx streaming client; publishes from another process; resume, epochs,
targeting, gaps, bad input and slow clients."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any

import httpx
import pytest

from shmbus import Bus
from shmbus.adapters.transports.sse import SSEApp, format_event, parse_event_id
from tests.harness.wait import wait_for

from .transport_util import Recorder, http_scope

SENTINEL = "/global/end"


def datas(events: list[Any], channel: str | None = None) -> list[Any]:
    return [
        e.json()["data"]
        for e in events
        if e.event and e.event.startswith("/") and (channel is None or e.event == channel)
    ]


def test_cross_process_channels_and_patterns(bus: Bus, server: Any, sse: Any, publisher: Any, bus_name: str) -> None:
    srv = server()
    params = [("channel", "/a"), ("prefix", "/tree"), ("glob", "/g/*"), ("channel", SENTINEL), ("events", "channel")]
    c = sse(srv.url + "/sse", params=params)
    assert c.status == 200
    assert c.headers["content-type"].startswith("text/event-stream")
    publisher(
        bus_name,
        [
            ("/a", {"n": 1}),
            ("/b", "no"),
            ("/tree", "t0"),
            ("/tree/x/y", "t2"),
            ("/treeX", "no"),
            ("/g/1", "g1"),
            ("/g/1/2", "no"),
            ("/a", {"n": 2}),
            (SENTINEL, "end"),
        ],
    )
    events = c.messages_until(SENTINEL)
    assert [(e.event, e.json()["data"]) for e in events] == [
        ("/a", {"n": 1}),
        ("/tree", "t0"),
        ("/tree/x/y", "t2"),
        ("/g/1", "g1"),
        ("/a", {"n": 2}),
        (SENTINEL, "end"),
    ]
    epoch = bus.epoch
    gids = []
    for e in events:
        ep, gid = parse_event_id(e.id)
        body = e.json()
        assert ep == epoch and gid == body["global_id"] and body["channel"] == e.event
        gids.append(gid)
    assert gids == sorted(gids) and len(set(gids)) == len(gids)
    assert bus.backlog("/a", 0)[1].message_id == events[4].json()["message_id"] == 2


def test_resume_misses_nothing_repeats_nothing(bus: Bus, server: Any, sse: Any, publisher: Any, bus_name: str) -> None:
    srv = server()
    params = [("channel", "/r"), ("prefix", "/p"), ("channel", SENTINEL), ("events", "channel")]
    c = sse(srv.url + "/sse", params=params)
    publisher(bus_name, [("/r", 1), ("/p/x", 2), ("/r", 3)])
    got = [c.next(), c.next(), c.next()]
    assert datas(got) == [1, 2, 3]
    last = got[-1].id
    c.close()
    publisher(bus_name, [("/r", 4), ("/other", "no"), ("/p/y", 5), ("/r", 6)])
    c2 = sse(srv.url + "/sse", params=params, headers={"Last-Event-ID": last})
    publisher(bus_name, [("/r", 7), (SENTINEL, "end")])
    events = c2.messages_until(SENTINEL)
    assert [e.event for e in events if not e.event.startswith("/")] == []  # no gap, no reset
    assert datas(events) == [4, 5, 6, 7, "end"]
    # the query-string fallback (EventSource polyfills) resumes the same way
    c3 = sse(srv.url + "/sse", params=[*params, ("last_event_id", last)])
    publisher(bus_name, [(SENTINEL, "end2")])
    assert datas(c3.messages_until(SENTINEL) + c3.messages_until(SENTINEL)) == [4, 5, 6, 7, "end", "end2"]


def test_epoch_change_detected(bus: Bus, server: Any, sse: Any, publisher: Any, bus_name: str) -> None:
    srv = server(SHMBUS_TEST_KEEPALIVE="0.3")
    publisher(bus_name, [("/e", "old-1"), ("/e", "old-2")])
    epoch = bus.epoch
    # a client whose id carries another epoch: told about the reset, then gets the current epoch's backlog
    c = sse(
        srv.url + "/sse", params=[("channel", "/e"), ("channel", SENTINEL)], headers={"Last-Event-ID": f"{epoch + 1}:1"}
    )
    first = c.next()
    assert first.event == "reset"
    assert first.json() == {"epoch": epoch, "previous_epoch": epoch + 1}
    assert [c.next().json()["data"] for _ in range(2)] == ["old-1", "old-2"]
    # a live reset while connected: reset event, then only new-epoch messages, each once
    bus.reset()
    new_epoch = bus.epoch
    assert new_epoch != epoch
    publisher(bus_name, [("/e", "new-1"), (SENTINEL, "end")])
    events = c.messages_until(SENTINEL)
    assert events[0].event == "reset"
    assert events[0].json() == {"epoch": new_epoch, "previous_epoch": epoch}
    assert datas(events) == ["new-1", "end"]
    assert all(parse_event_id(e.id)[0] == new_epoch for e in events[1:])


def test_targeting_never_leaks(bus: Bus, server: Any, sse: Any, publisher: Any, bus_name: str) -> None:
    srv = server()
    params = [("channel", "/t"), ("channel", SENTINEL)]
    url = srv.url + "/sse"
    a = sse(url, params=params, headers={"x-user": "1"})
    b = sse(url, params=params, headers={"x-user": "2", "x-groups": "7,8"})
    cc = sse(url, params=[*params, ("client_id", "tab-c")])
    d = sse(url, params=params, headers={"x-user": "1", "x-site": "s1"})
    anon = sse(url, params=params)
    publisher(
        bus_name,
        [
            ("/t", "u1", {"user_ids": [1]}),
            ("/t", "g7", {"group_ids": [7]}),
            ("/t", "tab-c", {"client_ids": ["tab-c"]}),
            ("/t", "u2", {"user_ids": [2]}),
            ("/t", "site-s1", {"site_id": "s1"}),
            ("/t", "u1-s1", {"user_ids": [1], "site_id": "s1"}),
            ("/t", "all"),
            (SENTINEL, "end"),
        ],
    )
    assert datas(a.messages_until(SENTINEL)) == ["u1", "all", "end"]
    assert datas(b.messages_until(SENTINEL)) == ["g7", "u2", "all", "end"]
    assert datas(cc.messages_until(SENTINEL)) == ["tab-c", "all", "end"]
    assert datas(d.messages_until(SENTINEL)) == ["site-s1", "u1-s1", "end"]
    assert datas(anon.messages_until(SENTINEL)) == ["all", "end"]
    # the replay path applies the same rules
    replay = sse(url, params=params, headers={"x-user": "2", "Last-Event-ID": f"{bus.epoch}:0"})
    assert datas(replay.messages_until(SENTINEL)) == ["u2", "all", "end"]


def test_gap_reported_when_backlog_trimmed(bus: Bus, server: Any, sse: Any) -> None:
    srv = server()
    bus.publish("/gp", 0)
    g0 = bus.backlog("/gp", 0)[-1].global_id
    for i in range(1, 11):
        bus.publish("/gp", i, max_backlog_size=3)
    c = sse(srv.url + "/sse", params=[("channel", "/gp")], headers={"Last-Event-ID": f"{bus.epoch}:{g0}"})
    first = c.next()
    assert first.event == "gap"
    assert first.json()["channels"] == ["/gp"]
    assert [c.next().json()["data"] for _ in range(3)] == [8, 9, 10]
    # resuming from the last retained message reports no gap
    last = bus.backlog("/gp", 0)[-1].global_id
    bus.publish("/gp", 11, max_backlog_size=3)
    c2 = sse(srv.url + "/sse", params=[("channel", "/gp")], headers={"Last-Event-ID": f"{bus.epoch}:{last}"})
    ev = c2.next()
    assert ev.event == "/gp" and ev.json()["data"] == 11


@pytest.mark.parametrize(
    ("query", "headers", "method", "status", "reason"),
    [
        (b"", [], "GET", 400, "at least one channel"),
        (b"channel=nope", [], "GET", 400, "must start with '/'"),
        (b"channel=/a%0Aevent:%20x", [], "GET", 400, "must not contain CR or LF"),
        (b"channel=/__mb_keepalive__/", [], "GET", 400, "reserved"),
        (b"channel=/a&client_id=bad%20id", [], "GET", 400, "invalid client id"),
        (b"channel=/a", [(b"last-event-id", b"garbage")], "GET", 400, "invalid Last-Event-ID"),
        (b"channel=/a&channel=/a%FF", [], "GET", 400, "malformed query"),
        (b"channel=/a", [], "POST", 405, "use GET"),
        # issue 34: named after channels a browser cannot know in advance, such a stream was silently empty
        (b"prefix=/chat", [], "GET", 400, "a prefix= or glob= stream needs events=message"),
        (b"channel=/a&glob=/g/*", [], "GET", 400, "needs events=message"),
    ],
)
def test_bad_input(bus: Bus, query: bytes, headers: list[Any], method: str, status: int, reason: str) -> None:
    app = SSEApp(bus=bus)
    rec = Recorder()

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    asyncio.run(app(http_scope("/sse", query, method, headers), receive, rec))
    app.close()
    assert rec.start()["status"] == status
    assert reason in rec.body().decode()


def test_other_paths_fall_through(bus: Bus) -> None:
    app = SSEApp(bus=bus)
    rec = Recorder()

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    asyncio.run(app(http_scope("/elsewhere"), receive, rec))
    app.close()
    assert rec.start()["status"] == 404


def test_format_event_cannot_inject_fields() -> None:
    out = format_event("/a\nid: 9", b'{"x":\n1}\r\nretry: 1', "1:2")
    assert out == b'id: 1:2\nevent: /a id: 9\ndata: {"x":\ndata: 1}\ndata: retry: 1\n\n'


def test_slow_client_dropped_in_process(bus: Bus) -> None:
    """A client whose writes block (flow control) is dropped once max_buffer bytes queue; memory stays bounded."""
    app = SSEApp(bus=bus, max_buffer=64 * 1024)
    rec = Recorder(block_after=1)  # the first write (the stream head) goes through, then the client stops reading
    sizes: list[int] = []

    async def main() -> None:
        never = asyncio.Event()

        async def receive() -> dict[str, Any]:
            await never.wait()
            return {}

        task = asyncio.ensure_future(app(http_scope("/sse", b"channel=/slow"), receive, rec))
        await asyncio.sleep(0)
        deadline = time.monotonic() + 20
        while app.hub.connections() == 0 or rec.body_sends == 0:
            assert time.monotonic() < deadline, "stream did not start"
            await asyncio.sleep(0.01)
        sink = next(iter(next(iter(app.hub._loops.values())).sinks))
        i = 0
        while not task.done():
            assert time.monotonic() < deadline, "slow client was never dropped"
            bus.publish("/slow", "x" * 4000 + str(i))
            i += 1
            sizes.append(sink.bytes_pending)
            await asyncio.sleep(0.002)
        await task
        assert sink.dropped

    asyncio.run(main())
    app.close()
    assert rec.blocked
    assert app.stats() == {"connections": 0, "dropped": 1}
    assert max(sizes) <= 64 * 1024 + 5000


def _stats(url: str) -> dict[str, Any]:
    return httpx.get(url + "/stats", timeout=10, trust_env=False).json()  # type: ignore[no-any-return]


def test_slow_client_dropped_by_real_server(bus: Bus, server: Any, publisher: Any, bus_name: str) -> None:
    srv = server(SHMBUS_TEST_MAX_BUFFER=str(64 * 1024))
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        s.connect(("127.0.0.1", srv.port))
        s.sendall(b"GET /sse?channel=/slow HTTP/1.1\r\nHost: x\r\n\r\n")
        s.settimeout(10)
        assert s.recv(100).startswith(b"HTTP/1.1 200")
        assert _stats(srv.url)["sse"]["connections"] == 1
        blob = "y" * 20_000
        for _ in range(40):  # up to ~20 MB, far beyond socket buffers; stop once dropped
            publisher(bus_name, [("/slow", blob)] * 25)
            st = _stats(srv.url)["sse"]
            if st["dropped"]:
                break
        wait_for(
            lambda: _stats(srv.url)["sse"] == {"connections": 0, "dropped": 1}, 20.0, what="the drop", interval=0.02
        )
    finally:
        s.close()
    # the server keeps serving others
    with httpx.Client(trust_env=False, timeout=10) as h:
        assert h.get(srv.url + "/health").status_code == 200
    assert json.loads(httpx.get(srv.url + "/stats", trust_env=False).text)["sse"]["dropped"] == 1


def _drive(app: SSEApp, bus: Bus, channel: str, act: Any, until: Any) -> list[Any]:
    """Open an in-process SSE stream on ``channel`` resuming from 0, call ``act()`` once the first bytes went out,
    wait until ``until(body)``, disconnect; return the ``data`` of every event sent."""
    rec = Recorder()

    async def main() -> None:
        gone = asyncio.Event()

        async def receive() -> dict[str, Any]:
            await gone.wait()
            return {"type": "http.disconnect"}

        headers = [(b"last-event-id", f"{bus.epoch}:0".encode())]
        task = asyncio.ensure_future(
            app(http_scope("/sse", f"channel={channel}".encode(), headers=headers), receive, rec)
        )
        deadline = time.monotonic() + 20
        while rec.body_sends == 0:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        act()
        while not until(rec.body()):
            assert time.monotonic() < deadline, rec.body()
            await asyncio.sleep(0.01)
        gone.set()
        await asyncio.wait_for(task, 20)

    asyncio.run(main())
    app.close()
    return [json.loads(line[6:])["data"] for line in rec.body().decode().splitlines() if line.startswith("data: ")]


def test_late_batch_never_repeats_replayed_messages(bus: Bus) -> None:
    """A listener batch that arrives after the replay read (it holds messages the replay already sent) is skipped."""
    for i in (1, 2, 3):
        bus.publish("/d", i)
    app = SSEApp(bus=bus)

    def act() -> None:
        next(iter(app.hub._loops.values())).dispatch(list(bus.backlog("/d", 0)))  # the late batch
        bus.publish("/d", 4)

    got = _drive(app, bus, "/d", act, lambda body: b"data: 4" in body or b'"data":4' in body)
    assert got == [1, 2, 3, 4]


def test_client_message_filters_apply(bus: Bus) -> None:
    """``register_client_message_filter`` withholds messages from replays and live delivery alike."""
    bus.register_client_message_filter("/f", lambda m: m.data != "hidden")
    bus.publish("/f", "hidden")
    bus.publish("/f", "shown")
    app = SSEApp(bus=bus)

    def act() -> None:
        bus.publish("/f", "hidden")
        bus.publish("/f", "live")

    assert _drive(app, bus, "/f", act, lambda body: b'"live"' in body) == ["shown", "live"]
