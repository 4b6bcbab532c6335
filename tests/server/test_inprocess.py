"""The lean server's connection driven in-process: a fake transport and a fake clock instead of gunicorn.

The real-server tests (test_http.py, test_hostile.py, test_worker.py) stay the outer ring; these pin the
connection's own behaviour byte for byte and without sleeping: pipelining order, requests split anywhere,
head/body deadlines, lingering close, read and write flow control, a parked long poll woken by a publish (a real
Bus), malformed requests, and the parser callbacks called one by one. Every connection here runs on
:class:`~mock_transport.FakeLoop` (timers fire only when the test moves the clock); ASGI app tasks run on the
real loop of :func:`rig.in_loop`. ``parser_kind`` runs each test with httptools and with the built-in parser.
The rig is tests/server/rig.py; the connection's parts one by one are in test_connection_parts.py.
"""

from __future__ import annotations

import asyncio
import itertools
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shmbus import Bus
from shmbus.adapters.asgi import MessageBusMiddleware
from shmbus.adapters.server import Limits
from shmbus.adapters.server.lifetime import Awaiting

from .mock_transport import responses, without_date
from .rig import LIMITS, LONG_POLL, Rig, delivered, echo, in_loop, make_rig
from .wire import poll, request


# ---------------------------------------------------------------------------------------------------- pipelining
@in_loop
async def test_two_pipelined_requests_in_one_read_are_answered_in_order(parser_kind: str) -> None:
    r = make_rig()
    r.send(request("GET", "/gate") + request("POST", "/b", b"body-b"))
    await r.settle()
    assert r.t.take() == b"", "the second request was answered before the first"
    assert r.app.seen == ["/gate"], "the second request started while the first was being answered"
    r.app.open()
    await r.settle()
    assert [x.body for x in r.answers()] == [echo("GET", "/gate"), echo("POST", "/b", b"body-b")]
    assert r.t.reading and not r.t.closed


@in_loop
async def test_a_request_arriving_while_a_long_poll_is_parked_waits_its_turn(
    parser_kind: str, mw: MessageBusMiddleware, shared_bus: Bus
) -> None:
    r = make_rig(mw)
    r.send(poll("c1", {"/x": shared_bus.last_id("/x")}) + request("GET", "/b"))
    await r.settle()
    r.send(request("GET", "/c"))  # a third one, in a later read
    await r.settle()
    assert r.t.take() == b"" and r.app.seen == [], "a request behind a parked poll was answered or started"
    r.loop.advance(LONG_POLL - 1)
    await r.settle()
    assert r.t.take() == b""
    r.loop.advance(1.5)  # the poll's long_polling_interval ends: it is answered empty, then the queue
    await r.settle()
    got = r.answers()
    assert [x.status for x in got] == [200, 200, 200]
    assert json.loads(got[0].body) == []
    assert [x.body for x in got[1:]] == [echo("GET", "/b"), echo("GET", "/c")]


# ---------------------------------------------------------------------------------------------------- splitting
PIPELINE = (
    request("POST", "/a?q=1", b"hello world")
    + request("POST", "/b", headers={"Transfer-Encoding": "chunked"})
    + b"3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    + request("GET", "/c%20d", version="1.0", headers={"Connection": "keep-alive"})
)
PIPELINE_ANSWERS = [echo("POST", "/a", b"hello world"), echo("POST", "/b", b"abcde"), echo("GET", "/c d")]


async def answer_in_pieces(pieces: list[bytes], settle: list[bool] | None = None) -> bytes:
    """What the connection writes when the client sends ``pieces``; ``settle[i]`` false: the next piece arrives
    before the app has run (so it is held behind the request being answered)."""
    r = make_rig()
    for i, piece in enumerate(pieces):
        r.send(piece)
        if settle is None or settle[i % len(settle)]:
            await r.settle()
    await r.settle()
    assert not r.t.closed
    return without_date(r.t.take())


def cut(data: bytes, at: list[int]) -> list[bytes]:
    edges = [0, *sorted(set(at)), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges) if b > a]


@in_loop
async def test_pipelined_requests_split_at_every_byte_boundary_answer_as_whole(parser_kind: str) -> None:
    whole = await answer_in_pieces([PIPELINE])
    assert [x.body for x in responses(whole)] == PIPELINE_ANSWERS
    for i in range(1, len(PIPELINE)):
        assert await answer_in_pieces(cut(PIPELINE, [i])) == whole, f"split at byte {i}"
    assert await answer_in_pieces([bytes([b]) for b in PIPELINE]) == whole, "fed byte by byte"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    at=st.lists(st.integers(min_value=1, max_value=len(PIPELINE) - 1), max_size=40),
    settle=st.lists(st.booleans(), min_size=1, max_size=8),
)
def test_pipelined_requests_split_anywhere_answer_as_whole(parser_kind: str, at: list[int], settle: list[bool]) -> None:
    async def go() -> None:
        whole = await answer_in_pieces([PIPELINE])
        assert await answer_in_pieces(cut(PIPELINE, at), settle) == whole

    asyncio.run(go())


# ---------------------------------------------------------------------------------------------------- deadlines
def test_a_head_not_complete_by_header_timeout_gets_408_then_a_lingering_close(parser_kind: str) -> None:
    r = make_rig()
    r.send(b"GET /slow HTTP/1.1\r\nHost: x\r\n")
    r.loop.advance(LIMITS.header_timeout - 1.5)
    assert r.t.take() == b"" and not r.t.eof_written
    r.loop.advance(2)
    [got] = r.answers()
    assert (got.status, got.body) == (408, b"request head not received within 5 s")
    assert got.headers["connection"] == "close"
    assert r.t.eof_written and not r.t.closed, "an error response must be followed by a lingering close"
    r.loop.advance(LIMITS.linger - 1)  # the 408 went out on the tick half a second ago
    assert not r.t.closed
    r.loop.advance(1)
    assert r.t.aborted, "a client that neither reads nor closes is aborted after linger"
    r.loop.run_due()
    assert r.conn not in r.srv.connections


@in_loop
async def test_a_body_not_complete_by_body_timeout_gets_408(parser_kind: str) -> None:
    r = make_rig()
    r.send(request("POST", "/echo", b"0123456789")[:-7])  # head and 3 of 10 body bytes
    await r.settle()
    r.loop.advance(LIMITS.body_timeout - 1.5)
    r.send(b"456")  # progress does not extend the deadline: the whole body must arrive within body_timeout
    await r.settle()
    assert r.t.take() == b""
    r.loop.advance(2)
    await r.settle()
    [got] = r.answers()
    assert (got.status, got.body) == (408, b"request body not received within 7 s")
    assert r.t.eof_written and r.app.seen == ["/echo"]


@in_loop
async def test_an_app_answering_after_a_408_on_its_connection_is_ignored_quietly(
    parser_kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The next head, pipelined behind a request the app has not answered yet, times out: the 408 closes the
    connection. The app's own answer, sent later, goes nowhere; it is not an app error (it logged one)."""
    r = make_rig()
    r.send(request("GET", "/gate") + b"GET /next HTTP/1.1\r\nHost: x\r\n")
    await r.settle()
    r.loop.advance(LIMITS.header_timeout + 1)
    await r.settle()
    [got] = r.answers()
    assert got.status == 408
    with caplog.at_level("ERROR", logger="shmbus"):
        r.app.open()
        await r.settle()
    assert r.t.take() == b"", "the app's answer went out after the 408"
    assert not [rec.getMessage() for rec in caplog.records if rec.levelname == "ERROR"]


def test_an_idle_keep_alive_connection_is_closed_after_keepalive(parser_kind: str) -> None:
    r = make_rig(with_app=False)
    r.send(request("GET", "/any"))  # no app: 404 at once
    assert [x.status for x in r.answers()] == [404]
    r.loop.advance(r.srv.keepalive - 1)
    assert not r.t.closed
    r.loop.advance(2)
    assert r.t.closed and not r.t.eof_written


# ---------------------------------------------------------------------------------------------------- lingering close
def test_lingering_close_drains_input_until_the_client_closes(parser_kind: str) -> None:
    r = make_rig()
    r.send(b"NOT HTTP\r\n\r\n")
    [got] = r.answers()
    assert got.status == 400
    assert r.t.events == ["write_eof"] and not r.t.closed
    r.send(request("GET", "/after") * 50)  # drained and discarded: nothing answered, not closed yet
    assert r.t.take() == b"" and not r.t.closed
    r.t.peer_eof()
    assert r.t.closed and not r.t.aborted
    r.loop.run_due()
    assert r.conn not in r.srv.connections


def test_a_client_closing_mid_request_gets_400_and_the_connection_closes(parser_kind: str) -> None:
    r = make_rig()
    r.send(b"GET /half HTTP/1.1\r\nHo")
    r.t.peer_eof()
    [got] = r.answers()
    assert (got.status, got.body) == (400, b"the client closed its side in the middle of a request")
    assert r.t.closed, "nothing left to drain once the client closed"


# ---------------------------------------------------------------------------------------------------- flow control
@in_loop
async def test_reading_pauses_over_max_pipeline_bytes_and_resumes_when_drained(parser_kind: str) -> None:
    r = make_rig()
    paths = [f"/p{i:03d}" for i in range(60)]
    data = request("GET", "/gate") + b"".join(request("GET", p, headers={"X-Pad": "y" * 150}) for p in paths)
    assert len(data) > 2 * LIMITS.max_pipeline_bytes
    pos = 0
    while pos < len(data) and r.t.reading:  # a peer sending 1000 bytes a read, as long as we read
        r.send(data[pos : pos + 1000])
        pos += 1000
        await r.settle()
    assert not r.t.reading and r.t.events == ["pause_reading"], r.t.events
    assert pos < len(data) and len(r.conn.inbox) < LIMITS.max_pipeline_bytes + 1000, "input not bounded"
    assert r.t.take() == b"" and r.app.seen == ["/gate"]
    r.app.open()
    while pos < len(data):
        await r.settle()
        assert r.t.reading, "reading did not resume as the held requests were answered"
        r.send(data[pos : pos + 1000])
        pos += 1000
    await r.settle()
    assert r.t.reading and r.t.events[-1] == "resume_reading"
    assert [x.body for x in r.answers()] == [echo("GET", p) for p in ["/gate", *paths]]


@in_loop
async def test_a_response_waits_while_the_transport_is_over_its_high_water_mark(parser_kind: str) -> None:
    r = make_rig(high=4096, low=1024, auto_flush=False)
    r.send(request("GET", "/chunks?n=40"))
    rounds = 0
    while not r.t.out.endswith(b"0\r\n\r\n"):
        await r.settle()
        if r.t.writing_paused:
            before = len(r.t.out)
            await r.settle()
            assert len(r.t.out) == before, "the app kept writing while the transport was paused"
            r.t.flush()
        rounds += 1
        assert rounds < 100, r.t.events[-5:]
    assert r.t.writes_while_paused == 0
    assert r.t.events.count("pause_writing") >= 5 and r.t.events.count("resume_writing") >= 5
    [got] = r.answers()
    assert got.body == b"".join(b"%04d" % i + b"x" * 1020 for i in range(40))


# ---------------------------------------------------------------------------------------------------- the bus
@in_loop
async def test_a_parked_long_poll_is_answered_by_a_publish(
    parser_kind: str, mw: MessageBusMiddleware, shared_bus: Bus
) -> None:
    r = make_rig(mw)
    timers = len(r.loop.pending())  # the server's tick
    r.send(poll("c1", {"/x": shared_bus.last_id("/x")}))
    await r.settle()
    parked = r.conn.parked
    assert r.t.take() == b"" and parked is not None and parked.waiter is not None, "the poll did not park"
    # a 30 s interval is ended by the server's 1 s clock (COARSE_EXPIRY): a deadline on the connection, no timer
    assert len(r.loop.pending()) == timers, "a timer per parked poll (long intervals are ended by the clock)"
    assert parked.expires == pytest.approx(r.loop.time() + LONG_POLL), "no long_polling_interval deadline"
    shared_bus.publish("/x", {"n": 1})
    await delivered(lambda: bool(r.t.out))
    [got] = r.answers()
    assert got.status == 200 and [m["data"] for m in json.loads(got.body)] == [{"n": 1}]
    assert r.conn.parked is None and parked.waiter is None and parked.timer is None
    assert parked.expires == 0.0, "the poll's deadline was left set"
    assert len(r.loop.pending()) == timers
    r.send(request("GET", "/next"))  # the connection is reusable
    await r.settle()
    assert [x.body for x in r.answers()] == [echo("GET", "/next")]


# ---------------------------------------------------------------------------------------------------- malformed
@pytest.mark.parametrize(
    "bad",
    [
        b"NOT HTTP\r\n\r\n",
        b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"GET / HTTP/1.1\r\nContent-Length: x1\r\n\r\n",
    ],
)
@in_loop
async def test_a_malformed_request_gets_400_with_a_reason_and_a_close(parser_kind: str, bad: bytes) -> None:
    r = make_rig()
    r.send(bad + request("GET", "/after"))
    await r.settle()
    [got] = r.answers()
    assert got.status == 400 and got.body.startswith(b"malformed request ("), got.body
    assert got.headers["connection"] == "close"
    assert r.t.eof_written, "no lingering close after the 400"


def test_a_head_over_max_head_size_gets_431(parser_kind: str) -> None:
    r = make_rig(limits=Limits(max_head_size=1024))
    r.send(request("GET", "/big", headers={"X-Big": "a" * 2000}))
    [got] = r.answers()
    assert (got.status, got.body) == (431, b"request head too large")


# ---------------------------------------------------------------------------------------------------- callbacks
class HeadOf:
    """What ``on_headers_complete`` asks of the parser, for feeding the callbacks by hand."""

    def __init__(self, method: bytes = b"GET", version: str = "1.1", keep: bool = True) -> None:
        self.method, self.version, self.keep = method, version, keep

    def get_method(self) -> bytes:
        return self.method

    def get_http_version(self) -> str:
        return self.version

    def should_keep_alive(self) -> bool:
        return self.keep


def begin(r: Rig, url: list[bytes], headers: list[tuple[bytes, bytes]], head: HeadOf | None = None) -> None:
    r.conn.reader.parser = head or HeadOf()
    r.conn.reader.on_message_begin()
    for piece in url:
        r.conn.reader.on_url(piece)
    for name, value in headers:
        r.conn.reader.on_header(name, value)


def test_callbacks_build_the_request_from_pieces() -> None:
    r = make_rig(with_app=False)
    r.loop.advance(0.5)  # a tick at a whole second only: the deadline counts from the server's coarse clock
    begin(r, [b"/a%20", b"b?x=1", b"#frag"], [(b"Host", b"h"), (b"X-Y", b"z")], HeadOf(b"DELETE", "1.0", keep=False))
    req = r.conn.reader.req
    assert req is not None and r.conn.idle == 0.0
    assert (r.conn.deadline, r.conn.awaiting) == (r.srv.now + LIMITS.header_timeout, Awaiting.HEAD)
    assert req.url == b"/a%20b?x=1#frag" and req.headers == [(b"host", b"h"), (b"x-y", b"z")]
    r.conn.reader.on_headers_complete()
    assert (req.method, req.version, req.path, req.raw_path, req.query) == ("DELETE", "1.0", "/a b", b"/a%20b", b"x=1")
    assert req.head_done and r.conn.awaiting is Awaiting.BODY
    r.conn.reader.on_message_complete()
    [got] = r.answers()
    assert got.status == 404 and "connection" not in got.headers  # HTTP/1.0 closes by default
    assert r.t.eof_written


def test_callbacks_refuse_a_head_over_the_limit_as_headers_arrive() -> None:
    r = make_rig(limits=Limits(max_head_size=100))
    begin(r, [b"/x"], [(b"a", b"1" * 40)])
    assert r.t.take() == b""
    r.conn.reader.on_header(b"b", b"2" * 60)
    [got] = r.answers()
    assert (got.status, got.body) == (431, b"request head too large")
    r.conn.reader.on_header(b"c", b"3")  # after the refusal the callbacks ignore the rest
    r.conn.reader.on_body(b"ignored")
    assert r.conn.reader.req is None and r.t.take() == b""


def test_callbacks_refuse_an_unsupported_expect() -> None:
    r = make_rig(with_app=False)
    begin(r, [b"/x"], [(b"expect", b"something-else")])
    r.conn.reader.on_headers_complete()
    [got] = r.answers()
    assert (got.status, got.body) == (417, b"unsupported Expect")


def test_callbacks_refuse_a_declared_body_over_max_body_size_before_reading_it() -> None:
    r = make_rig(with_app=False)
    begin(r, [b"/up"], [(b"content-length", b"%d" % (LIMITS.max_body_size + 1))], HeadOf(b"POST"))
    r.conn.reader.on_headers_complete()
    [got] = r.answers()
    assert (got.status, got.body) == (413, b"request body too large (limit 1000 bytes)")
    assert r.t.eof_written and r.conn.queue is None


@in_loop
async def test_callbacks_refuse_a_body_that_grows_over_max_body_size() -> None:
    r = make_rig()
    begin(r, [b"/up"], [(b"transfer-encoding", b"chunked")], HeadOf(b"POST"))
    r.conn.reader.on_headers_complete()
    await r.settle()
    r.conn.reader.on_body(b"a" * 600)
    await r.settle()
    assert r.t.take() == b""
    r.conn.reader.on_body(b"b" * 600)
    await r.settle()
    [got] = r.answers()
    assert (got.status, got.body) == (413, b"request body too large (limit 1000 bytes)")
    assert r.t.eof_written


@in_loop
async def test_a_stream_holds_messages_while_the_transport_is_paused_and_sends_them_on_resume(
    parser_kind: str, mw: MessageBusMiddleware, shared_bus: Bus
) -> None:
    r = make_rig(mw, high=300, low=100, auto_flush=False)
    r.send(poll("c2", {"/x": shared_bus.last_id("/x")}, chunk=True))
    await r.settle()
    head = r.t.take()
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"transfer-encoding: chunked" in head
    shared_bus.publish("/x", "a" * 400)  # over the high-water mark: the transport pauses writing
    await delivered(lambda: r.t.writing_paused)
    assert b'"data":"' + b"a" * 400 in r.t.take()
    shared_bus.publish("/x", "second")
    assert r.conn.parked is not None
    client = r.conn.parked.waiter
    assert client is not None
    await delivered(lambda: bool(client.pending))  # queued for the client, not written
    await r.settle()
    assert r.t.take() == b"" and r.t.writes_while_paused == 0
    r.t.flush()  # the peer reads: resume_writing sends what was held
    assert b'"data":"second"' in r.t.take() and r.t.events == ["pause_writing", "resume_writing"]
    assert r.conn.parked is not None and r.conn.parked.waiter is client, "the stream should stay open"
