"""The lean server's 1 s clock (``Server._tick``) visits only connections with something due (its due list), and
everything still happens on the same tick as when it visited every connection every second: parked polls' ends,
idle keep-alive closes, the 408 head and body deadlines, lingering closes (fake transports and clock:
tests/server/rig.py)."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from email.utils import formatdate
from typing import Any

import pytest

from shmbus import Bus
from shmbus.adapters.asgi import MessageBusMiddleware
from shmbus.adapters.server import Server
from shmbus.adapters.server.connection import HttpConnection
from shmbus.adapters.server.lifetime import ConnState
from shmbus.adapters.server.serve import connection_factory

from .mock_transport import FakeTransport
from .rig import LONG_POLL, EchoApp, Rig, in_loop, make_rig
from .wire import poll, request

STREAM_END = b"0\r\n\r\n"


@pytest.fixture
def visits(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[HttpConnection]]:
    """How often the clock visited each connection (its ``tick`` calls)."""
    seen: Counter[HttpConnection] = Counter()
    tick = HttpConnection.tick

    def counted(self: HttpConnection, now: float, idle_cutoff: float) -> None:
        seen[self] += 1
        tick(self, now, idle_cutoff)

    monkeypatch.setattr(HttpConnection, "tick", counted)
    yield seen


def every_connection(srv: Server) -> None:
    """The clock as it was before its due list: every connection, every second (the reference)."""
    srv.date = b"date: %s\r\n" % formatdate(usegmt=True).encode()
    srv.now = now = srv.loop.time()
    for conn in list(srv.connections):
        conn.tick(now, now - srv.keepalive)
    srv.loop.call_at(now + 1.0, srv._tick)


def first_tick(when: float) -> float:
    """The first tick at or after ``when`` (the rig's clock starts at a whole second: ticks fall on whole seconds)."""
    second = float(int(when))
    return second if second >= when else second + 1.0


def connect(r: Rig) -> tuple[FakeTransport, HttpConnection]:
    t = FakeTransport(r.loop)
    conn = t.connect(connection_factory(r.srv)())
    assert isinstance(conn, HttpConnection)
    return t, conn


@in_loop
async def test_parked_streams_are_visited_only_when_due_and_still_end_and_close_on_time(
    parser_kind: str, mw: MessageBusMiddleware, shared_bus: Bus, visits: Counter[HttpConnection]
) -> None:
    """Twenty streams parked at odd fractions of a second: each ends on the first tick at or after its
    ``long_polling_interval`` (COARSE_EXPIRY), then is closed as idle on the first tick ``keepalive`` after that,
    and the clock visited each at most three times in those ~36 s (not every second): in its end's second, maybe
    once early in it (the end is due within that second), and for the idle close."""
    r = make_rig(mw)
    last = shared_bus.last_id("/x")
    streams = []
    for i in range(20):
        r.loop.advance(0.37)
        t, conn = connect(r)
        t.receive(poll(f"c{i}", {"/x": last}, chunk=True))
        assert conn.parked is not None and conn.parked.expires == r.loop.now + LONG_POLL
        streams.append((t, conn, first_tick(conn.parked.expires)))
    ended: dict[int, float] = {}
    closed: dict[int, float] = {}
    while len(closed) < len(streams):
        assert r.loop.now < 1100, "a stream never ended or was never closed"
        r.loop.advance(1.0)
        for i, (t, _, _) in enumerate(streams):
            if i not in ended and t.out.endswith(STREAM_END):
                ended[i] = r.srv.now
            if i not in closed and t.closed:
                closed[i] = r.srv.now
    for i, (t, conn, due) in enumerate(streams):
        assert ended[i] == due, f"stream {i} ended on the tick {ended[i] - due:+g} s from its interval's"
        assert closed[i] == ended[i] + r.srv.keepalive and not t.aborted, f"stream {i}: idle close late or early"
        assert visits[conn] <= 3, f"stream {i} was visited {visits[conn]} times in {closed[i] - due + LONG_POLL:g} s"
    r.loop.run_due()  # (the transports' connection_lost)
    assert r.conn.state is ConnState.CLOSED and not r.srv._due, "a closed connection stayed on the clock"


@in_loop
async def test_connections_that_close_leave_the_clock(
    parser_kind: str, mw: MessageBusMiddleware, shared_bus: Bus
) -> None:
    """Parked streams whose clients go away (and connections closed any other way) leave the due list at once,
    not when their deadline's second comes: nothing of a closed connection is held."""
    r = make_rig(mw)
    last = shared_bus.last_id("/x")
    ts = [connect(r)[0] for _ in range(5)]
    for i, t in enumerate(ts):
        t.receive(poll(f"c{i}", {"/x": last}, chunk=True))
    assert sum(map(len, r.srv._due.values())) == 6
    for t in ts:
        t.close()  # the peers went away
    r.loop.run_due()
    assert [c for conns in r.srv._due.values() for c in conns] == [r.conn]


def test_a_busy_keep_alive_connection_is_visited_once_per_keepalive_and_closed_on_time(
    parser_kind: str, visits: Counter[HttpConnection]
) -> None:
    """A request every 0.7 s moves the idle deadline later each time: the clock finds it not due every
    ``keepalive`` seconds (not every second), and closes it on the first tick ``keepalive`` after the last one."""
    r = make_rig(with_app=False)
    for _ in range(40):
        r.loop.advance(0.7)
        r.send(request("GET", "/a"))
        assert [x.status for x in r.answers()] == [404]
    last_idle, seen = r.conn.idle, visits[r.conn]
    assert seen <= 40 * 0.7 / r.srv.keepalive + 2, f"visited {seen} times in 28 s"
    while not r.t.closed:
        r.loop.advance(1.0)
    assert r.srv.now == first_tick(last_idle + r.srv.keepalive)
    r.loop.run_due()
    assert r.conn.due == float("inf") and not r.srv._due, "a closed connection stayed on the clock"


@pytest.mark.parametrize("seed", range(6))
@in_loop
async def test_the_due_list_changes_nothing_a_visit_of_every_connection_would_do(
    parser_kind: str, shared_bus: Bus, visits: Counter[HttpConnection], seed: int
) -> None:
    """Connections doing random things at random times (answered requests, parked polls, slow heads and bodies,
    closing requests and lingering, clients closing) write, close and abort at exactly the same steps of the
    clock whether the clock visits every connection every second (the reference) or its due list alone."""
    runs = []
    for reference in (True, False):
        visits.clear()
        with pytest.MonkeyPatch.context() as mp:
            if reference:
                mp.setattr(Server, "_tick", every_connection)
            runs.append((await _history(shared_bus, random.Random(seed)), sum(visits.values())))
    (want, every), (got, due_list) = runs
    assert got == want, "the due list changed what the connections did, or when"
    assert due_list < every / 3, (due_list, every)


async def _history(bus: Bus, rnd: random.Random) -> list[Any]:
    """Random actions on 12 connections for 60 s in 0.1 s steps, and a stall of the loop (a closed connection is
    replaced by a new one, at a random step); each step's state of every transport."""
    mw = MessageBusMiddleware(EchoApp(), bus=bus, long_polling_interval=LONG_POLL)
    try:
        r = make_rig(mw)
        last = bus.last_id("/x")

        def action(kind: int, client: str) -> bytes:
            return [
                poll(client, {"/x": last}, dlp=True),  # answered at once
                poll(client, {"/x": last}, dlp=True),
                poll(client, {"/x": last}, chunk=True),  # parked: ends after LONG_POLL
                poll(client, {"/x": last}),  # parked long poll
                b"GET /slow HTTP/1.1\r\n",  # a head that ends (or not) later: 408 after header_timeout
                b"Host: h\r\n\r\n",
                b"POST /message-bus/b/poll HTTP/1.1\r\nContent-Length: 10\r\n\r\nab",  # a slow body: 408
                poll(client, {"/x": last}, dlp=True, headers={"Connection": "close"}),  # then a lingering close
            ][kind]

        slots = [connect(r)[0] for _ in range(12)]
        every = [t for t in slots]
        rates = [rnd.choice((0.01, 0.04, 0.1)) for _ in slots]  # how busy each slot's client is
        history = []
        for step in range(600):
            if step < 450:
                for i, t in enumerate(slots):
                    roll = rnd.random()
                    if t.closed:
                        if roll < 0.05:
                            slots[i] = connect(r)[0]
                            every.append(slots[i])
                    elif roll < rates[i]:
                        t.receive(action(rnd.randrange(8), f"c{step}-{i}"))
                    elif roll < rates[i] + 0.002:
                        t.peer_eof()
            if step == 300:
                r.loop.now += 70.0  # the loop stalled: the next tick comes 70 s late
            r.loop.advance(0.1)
            await r.settle()  # the wrapped app's answers (a slow head, once complete, is the app's)
            history.append([(len(t.out), tuple(t.events), t.closed) for t in every])
        for t in slots:
            t.close()
        r.loop.run_due()
        await r.loop.cancel_tasks()
        return history
    finally:
        mw.close()
