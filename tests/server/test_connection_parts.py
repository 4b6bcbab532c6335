"""The lean server's connection parts one by one, in-process (the rig of tests/server/rig.py, no sockets).

The :class:`~shmbus.adapters.server.reader.RequestReader` against a recording owner (the parser callbacks as the
events a connection gets), and the connection's paths the whole-request tests of test_inprocess.py pass by:
reading paused while an app leaves its body unread (and no deadline while paused), the idle clock against a head
that has begun, a half-closed client's pipelined requests, a close without half-close, a parked poll unregistered
when its client goes away and answered at once when the server stops (its own short timer cancelled), and a slow
head behind a parked poll that still meets its deadline.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from shmbus import Bus
from shmbus.adapters.asgi import MessageBusMiddleware
from shmbus.adapters.server import MAX_BUFFERED, Limits, Server
from shmbus.adapters.server.reader import RequestReader
from shmbus.adapters.server.request import Request

from .mock_transport import FakeLoop
from .rig import LIMITS, EchoApp, echo, in_loop, make_rig
from .wire import poll, request


# ---------------------------------------------------------------------------------------------------- the reader
class Owner:
    """A connection as the reader sees it (:class:`~shmbus.adapters.server.reader.ReaderOwner`), recording."""

    def __init__(self) -> None:
        self.closing = False
        self.events: list[tuple[Any, ...]] = []
        self.requests: list[Request] = []

    def message_begun(self) -> None:
        self.events.append(("begun",))

    def head_ready(self, req: Request) -> None:
        self.requests.append(req)
        self.events.append(("head", req.method, req.path, req.query))

    def body_buffered(self, req: Request, nbytes: int) -> None:
        self.events.append(("body", nbytes))

    def message_complete(self, req: Request) -> None:
        self.events.append(("complete", req.path, b"".join(req.body)))

    def fail(self, status: int, reason: str) -> None:
        self.events.append(("fail", status))
        self.closing = True

    def upgraded(self) -> None:
        self.events.append(("upgraded",))


def reader_of(app: Any = None, limits: Limits = LIMITS) -> tuple[RequestReader, Owner]:
    owner = Owner()
    srv = Server(app, cast(asyncio.AbstractEventLoop, FakeLoop()), limits=limits)
    return RequestReader(srv, owner), owner


def test_the_reader_reports_each_request_to_its_owner_in_order(parser_kind: str) -> None:
    reader, owner = reader_of()
    data = request("POST", "/a?q=1", b"hello") + request("GET", "/b")
    for i in range(0, len(data), 7):  # in pieces: the events do not depend on where reads end
        assert reader.feed(data[i : i + 7])
    body = [e for e in owner.events if e[0] == "body"]
    assert sum(n for _, n in body) == 5
    assert [e for e in owner.events if e[0] != "body"] == [
        ("begun",),
        ("head", "POST", "/a", b"q=1"),
        ("complete", "/a", b"hello"),
        ("begun",),
        ("head", "GET", "/b", b""),
        ("complete", "/b", b""),
    ]
    assert reader.req is None


def test_the_reader_keeps_a_bus_requests_body_on_the_request_without_reporting_it(
    parser_kind: str, mw: MessageBusMiddleware
) -> None:
    reader, owner = reader_of(mw)
    data = poll("c1", {"/x": 0})
    assert reader.feed(data)
    assert [e[0] for e in owner.events] == ["begun", "head", "complete"], "a bus body is not the bridge's business"
    [req] = owner.requests
    assert req.bus and req.complete and b"".join(req.body) == data.partition(b"\r\n\r\n")[2]


def test_the_reader_refuses_a_bus_body_over_the_middlewares_limit_without_keeping_it(
    parser_kind: str, shared_bus: Bus
) -> None:
    m = MessageBusMiddleware(EchoApp(), bus=shared_bus, max_body_size=100)
    chunked = {"Transfer-Encoding": "chunked"}
    try:
        reader, owner = reader_of(m)
        assert reader.feed(request("POST", "/message-bus/c1/poll", headers=chunked) + b"3c\r\n" + b"a" * 60 + b"\r\n")
        assert reader.feed(b"0\r\n\r\n")
        assert not owner.requests[0].too_large and owner.requests[0].body == [b"a" * 60]
        big = b"3c\r\n" + b"b" * 60 + b"\r\n" + b"3c\r\n" + b"c" * 60 + b"\r\n0\r\n\r\n"  # no length to refuse early
        assert reader.feed(request("POST", "/message-bus/c2/poll", headers=chunked) + big)
        assert owner.requests[1].too_large and owner.requests[1].body == [], "an oversized body was kept"
        assert [e[0] for e in owner.events].count("complete") == 2  # the bus route answers 413, not the reader
    finally:
        m.close()


def test_the_reader_reports_a_malformed_request_and_stops(parser_kind: str) -> None:
    reader, owner = reader_of()
    assert not reader.feed(b"NOT HTTP\r\n\r\n")
    assert owner.events[-1] == ("fail", 400)


def test_the_reader_reports_a_head_over_the_limit_once(parser_kind: str) -> None:
    reader, owner = reader_of(limits=Limits(max_head_size=200))
    reader.feed(b"GET /x HTTP/1.1\r\n" + b"".join(b"h%d: %s\r\n" % (i, b"v" * 40) for i in range(10)) + b"\r\n")
    assert [e for e in owner.events if e[0] == "fail"] == [("fail", 431)]
    assert not any(e[0] == "head" for e in owner.events), "a refused head was queued"


def test_the_reader_reports_an_upgrade_or_serves_it_as_plain_http(parser_kind: str) -> None:
    """httptools reports an upgrade (the connection hands over); the built-in parser has no upgrades and queues
    the request as a plain one."""
    reader, owner = reader_of()
    handed_over = not reader.feed(request("GET", "/ws", headers={"Connection": "Upgrade", "Upgrade": "websocket"}))
    if parser_kind == "pure":
        assert not handed_over and ("upgraded",) not in owner.events
        assert any(e[0] == "head" for e in owner.events), owner.events
    else:
        assert handed_over and owner.events[-1] == ("upgraded",)


# ---------------------------------------------------------------------------------------------------- flow control
@in_loop
async def test_reading_pauses_while_an_app_leaves_its_body_unread_and_no_deadline_runs(parser_kind: str) -> None:
    r = make_rig(limits=Limits(body_timeout=7, max_body_size=1 << 20))
    body = bytes(range(256)) * ((MAX_BUFFERED + 64 * 1024) // 256)
    data = request("POST", "/gate", body)
    pos = 0
    while pos < len(data) and r.t.reading:  # the app waits at its gate before reading anything
        r.send(data[pos : pos + 16384])
        pos += 16384
        await r.settle()
    assert not r.t.reading and r.t.events == ["pause_reading"], "reading went on past MAX_BUFFERED"
    assert pos < len(data) and r.conn.deadline == 0.0, "a client is not late while we do not read"
    r.loop.advance(30)  # far past body_timeout: the app is slow, not the client
    assert r.t.take() == b"" and not r.t.eof_written
    r.app.open()
    await r.settle()
    assert r.t.reading and r.t.events == ["pause_reading", "resume_reading"]
    assert r.conn.deadline == r.srv.now + 7, "the body's clock did not run again on resume"
    while pos < len(data):
        r.send(data[pos : pos + 16384])
        pos += 16384
        await r.settle()
    [got] = r.answers()
    assert got.body == echo("POST", "/gate", body)


# ---------------------------------------------------------------------------------------------------- deadlines
def test_a_head_that_has_begun_is_not_closed_as_idle(parser_kind: str) -> None:
    r = make_rig(with_app=False)
    r.send(request("GET", "/a"))
    assert [x.status for x in r.answers()] == [404]
    r.loop.advance(r.srv.keepalive - 2)
    r.send(b"GET /b HTTP/1.1\r\n")  # the next head begins: the connection is busy, not idle
    r.loop.advance(3)  # past keepalive since the first response
    assert not r.t.closed and r.t.take() == b""
    r.loop.advance(LIMITS.header_timeout)
    [got] = r.answers()
    assert (got.status, got.body) == (408, b"request head not received within 5 s")


# ---------------------------------------------------------------------------------------------------- closing
@in_loop
async def test_a_half_closed_client_gets_every_pipelined_answer_then_a_close(parser_kind: str) -> None:
    r = make_rig()
    r.send(request("GET", "/gate") + request("POST", "/b", b"x"))
    await r.settle()
    r.t.peer_eof()  # while the first is being answered: the connection stays open for the answers
    assert not r.t.closed
    r.app.open()
    await r.settle()
    assert [x.body for x in r.answers()] == [echo("GET", "/gate"), echo("POST", "/b", b"x")]
    assert r.t.closed and not r.t.eof_written and not r.t.aborted, "nothing to drain: a plain close"


def test_an_error_closes_at_once_when_the_transport_cannot_half_close(parser_kind: str) -> None:
    r = make_rig(half_close=False)
    r.send(b"NOT HTTP\r\n\r\n")
    [got] = r.answers()
    assert got.status == 400 and r.t.closed and not r.t.eof_written


# ---------------------------------------------------------------------------------------------------- parked polls
@in_loop
async def test_a_parked_poll_is_unregistered_when_its_client_goes_away(
    parser_kind: str, mw: MessageBusMiddleware, shared_bus: Bus
) -> None:
    r = make_rig(mw)
    r.send(poll("gone", {"/x": shared_bus.last_id("/x")}, chunk=True))
    await r.settle()
    registry = r.srv.proto.registry
    assert "gone" in registry.by_id and r.conn.parked is not None
    r.t.close()  # the peer went away: asyncio calls connection_lost
    r.loop.run_due()
    assert "gone" not in registry.by_id and registry.parked == 0 and r.conn.parked is None


@in_loop
async def test_a_parked_poll_is_answered_at_once_when_the_server_stops(
    parser_kind: str, mw: MessageBusMiddleware, shared_bus: Bus
) -> None:
    r = make_rig(mw)
    r.send(poll("c1", {"/x": shared_bus.last_id("/x")}))
    await r.settle()
    assert r.conn.parked is not None and r.conn.responding is False
    r.srv.stopping = True
    r.conn.stop()
    [got] = r.answers()
    assert got.status == 200 and got.body == b"[]" and got.headers["connection"] == "close"
    assert r.conn.parked is None and r.t.eof_written


@in_loop
async def test_a_short_poll_ended_by_the_server_stop_leaves_no_timer_behind(parser_kind: str, shared_bus: Bus) -> None:
    """A poll whose interval is shorter than COARSE_EXPIRY has a timer of its own. Ended by anything else (here
    the server stopping), the poll cancels it: only that timer's own firing may forget it. Were ``expire`` to
    forget it for every caller, the ending would not cancel it, and a stopped server's loop would keep a live
    callback holding the connection, its request and its waiter until the interval ran out."""
    mw = MessageBusMiddleware(EchoApp(), bus=shared_bus, long_polling_interval=2.0)
    try:
        r = make_rig(mw)
        r.send(poll("c1", {"/x": shared_bus.last_id("/x")}))
        await r.settle()
        parked = r.conn.parked
        assert parked is not None and parked.timer is not None and not parked.expires  # its own timer
        timer = parked.timer
        r.srv.stopping = True
        r.conn.stop()
        [got] = r.answers()
        assert got.status == 200 and got.body == b"[]" and r.conn.parked is None
        assert cast(Any, timer).cancelled, "the ended poll's timer is still scheduled"
        assert all(getattr(t.callback, "__self__", None) is not parked for t in r.loop.pending())
    finally:
        mw.close()


@in_loop
async def test_a_slow_head_behind_a_parked_poll_still_meets_its_deadline(
    parser_kind: str, mw: MessageBusMiddleware, shared_bus: Bus
) -> None:
    r = make_rig(mw)
    r.send(poll("c1", {"/x": shared_bus.last_id("/x")}) + b"GET /b HTTP/1.1\r\n")  # a head that never ends
    await r.settle()
    assert r.conn.parked is not None
    r.loop.advance(LIMITS.header_timeout + 1.5)  # long before the poll's own 30 s
    assert r.t.eof_written, "the parked poll shielded a slow head from its deadline"
    assert r.conn.parked is None and "c1" not in r.srv.proto.registry.by_id
