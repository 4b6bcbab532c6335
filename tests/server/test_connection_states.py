"""A lean-server connection's states (adapters/server/lifetime.py): the table of legal moves, and the connection
taking only those through its life (fake transport and clock: tests/server/rig.py)."""

from __future__ import annotations

import itertools

import pytest

from shmbus.adapters.server.lifetime import CONNECTION_MOVES, ConnState
from shmbus.errors import IllegalTransition

from .rig import LIMITS, echo, in_loop, make_rig
from .wire import request

C = ConnState

#: The life of a connection, written out here independently of the module's table (staying is always legal).
EXPECTED = {
    (C.OPEN, C.HALF_CLOSED),
    (C.OPEN, C.FINISHING),
    (C.OPEN, C.LINGERING),
    (C.OPEN, C.CLOSED),
    (C.HALF_CLOSED, C.CLOSED),
    (C.FINISHING, C.LINGERING),
    (C.FINISHING, C.CLOSED),
    (C.LINGERING, C.CLOSED),
}


def test_the_table_is_the_expected_life() -> None:
    assert {(a, b) for a, tos in CONNECTION_MOVES.items() for b in tos} == EXPECTED


@pytest.mark.parametrize(("now", "to"), list(itertools.product(ConnState, ConnState)))
def test_every_move_from_every_state(now: ConnState, to: ConnState) -> None:
    conn = make_rig(with_app=False).conn
    conn.state = now
    if now is to or (now, to) in EXPECTED:
        conn._move(to)
        assert conn.state is to
    else:
        with pytest.raises(IllegalTransition, match=f"{now.value} -> {to.value}"):
            conn._move(to)
        assert conn.state is now, "an illegal move changes nothing"


def test_closing_and_eof_follow_the_state() -> None:
    conn = make_rig(with_app=False).conn
    seen = {}
    for state in ConnState:
        conn.state = state
        seen[state] = (conn.closing, conn.eof)
    assert seen == {
        C.OPEN: (False, False),
        C.HALF_CLOSED: (False, True),
        C.FINISHING: (True, False),
        C.LINGERING: (True, False),
        C.CLOSED: (True, False),
    }


def test_a_closing_answer_lingers_then_the_clock_aborts(parser_kind: str) -> None:
    r = make_rig(with_app=False)
    assert r.conn.state is C.OPEN
    r.send(request("GET", "/a", headers={"Connection": "close"}))
    assert [x.status for x in r.answers()] == [404]
    assert r.conn.state is C.LINGERING and r.t.eof_written and not r.t.closed
    r.loop.advance(LIMITS.linger + 1)
    assert r.conn.state is C.CLOSED and r.t.aborted


def test_an_idle_connection_is_closed_by_the_clock(parser_kind: str) -> None:
    r = make_rig(with_app=False)
    r.send(request("GET", "/a"))
    assert [x.status for x in r.answers()] == [404] and r.conn.state is C.OPEN
    r.loop.advance(r.srv.keepalive + 2)
    assert r.conn.state is C.CLOSED and r.t.closed


def test_a_client_closing_mid_request_gets_a_400_and_a_close(parser_kind: str) -> None:
    r = make_rig(with_app=False)
    r.send(b"GET /a HTTP/1.1\r\n")
    r.t.peer_eof()
    [got] = r.answers()
    assert got.status == 400 and r.conn.state is C.CLOSED and r.t.closed and not r.t.eof_written


def test_a_lost_connection_stays_closed(parser_kind: str) -> None:
    r = make_rig(with_app=False)
    r.conn.connection_lost(None)
    assert r.conn.state is C.CLOSED
    with pytest.raises(IllegalTransition):
        r.conn._move(C.LINGERING)  # a closed connection never lingers again


@in_loop
async def test_an_upgrade_the_app_answers_ends_the_connection(parser_kind: str) -> None:
    """An upgrade is served as plain HTTP, then the connection ends: finishing is not a state to stay in (it did,
    open and never swept, when the ASGI app answered the request)."""
    r = make_rig()
    r.send(b"GET /a HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
    await r.settle()
    [got] = r.answers()
    assert (got.status, got.body) == (200, echo("GET", "/a"))
    if parser_kind == "httptools":  # an upgrade: nothing after it is read, so the answer ends the connection
        assert got.headers.get("connection") == "close"
        assert r.conn.state is C.LINGERING and r.t.eof_written
        r.loop.advance(LIMITS.linger + 1)
        assert r.conn.state is C.CLOSED and r.t.closed
    else:  # the built-in parser has no upgrades: a plain request, the connection kept
        assert r.conn.state is C.OPEN and not r.t.eof_written and got.headers.get("connection") != "close"
