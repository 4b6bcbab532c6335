"""A waiting request's stages (adapters/http/waiter.py): the table of legal moves, and the registry taking them."""

from __future__ import annotations

import itertools

import pytest

from shmbus import Bus
from shmbus.adapters import http as P
from shmbus.adapters.http.registry import Registry
from shmbus.adapters.http.waiter import MOVES, Ending, Lookups, Move, Stage, Waiter
from shmbus.errors import IllegalTransition

S, M = Stage, Move

#: The life of a waiter, written out here independently of the module's table: what each move does from each stage.
EXPECTED = {
    (S.NEW, M.CAPTURE): S.CAPTURING,
    (S.CAPTURING, M.PARK): S.PARKED,
    (S.CAPTURING, M.LEAVE): S.LEFT,
    (S.PARKED, M.END): S.ENDING,
    (S.ENDING, M.END): S.ENDING,
    (S.LEFT, M.END): S.ENDED,
    (S.ENDED, M.END): S.ENDED,
    (S.ENDING, M.RELEASE): S.ENDED,
    (S.PARKED, M.FINISH): S.ENDED,
    (S.ENDING, M.FINISH): S.ENDED,
    (S.LEFT, M.FINISH): S.ENDED,
    (S.ENDED, M.FINISH): S.ENDED,
}


def waiter(stage: Stage, client_id: str = "c", seq: int = 1) -> Waiter:
    w = Waiter(client_id, seq, Lookups(), ["/a"], streaming=False, epoch=0)
    w.stage = stage
    return w


def test_the_table_is_the_expected_life() -> None:
    assert MOVES == EXPECTED


@pytest.mark.parametrize(("stage", "move"), list(itertools.product(Stage, Move)))
def test_every_move_from_every_stage(stage: Stage, move: Move) -> None:
    w = waiter(stage)
    if (stage, move) in EXPECTED:
        assert w.move(move) is EXPECTED[stage, move] and w.stage is EXPECTED[stage, move]
    else:
        with pytest.raises(IllegalTransition, match=f"{move.name} is not a move from {stage.name}"):
            w.move(move)
        assert w.stage is stage, "an illegal move changes nothing"


def test_done_and_end_follow_the_stage() -> None:
    w = waiter(S.PARKED)
    assert not w.done
    w.end(Ending.DROPPED)
    assert w.stage is S.ENDING and w.done and w.dropped
    w.end(Ending.RESET)
    assert w.ending is Ending.DROPPED, "a dropped client stays dropped"
    with pytest.raises(IllegalTransition):
        waiter(S.CAPTURING).end(Ending.RESET)  # nothing may end a request whose backlog is still being read


def test_the_registry_moves_a_long_poll_through_its_life(bus: Bus) -> None:
    reg = Registry(bus)
    c = Waiter("c", 1, Lookups(), ["/a"], streaming=False, epoch=bus.epoch)
    with pytest.raises(IllegalTransition):
        reg.park(c)  # never captured: refused before anything changed
    assert reg.parked == 0 and not reg.by_id and c.stage is S.NEW
    reg.capture(c)
    assert c.stage is S.CAPTURING and reg.parked == 0
    with pytest.raises(IllegalTransition):
        reg.finish(c)  # its backlog is still being read
    assert reg.park(c) == (True, []) and c.stage is S.PARKED and reg.parked == 1
    with pytest.raises(IllegalTransition):
        reg.park(c)  # parked twice would count it twice
    assert reg.parked == 1
    bus.publish("/a", "x")
    assert reg.dispatch(list(bus.backlog("/a", 0))) == [c]
    assert c.stage is S.ENDED and reg.parked == 0 and not reg.index and not reg.by_id
    pending, _ = reg.finish(c)
    assert len(pending) == 1
    assert reg.finish(c) == ([], None) and c.stage is S.ENDED


def test_a_newer_request_supersedes_and_an_older_one_leaves(bus: Bus) -> None:
    reg = Registry(bus)
    first, second, stale = (Waiter("c", seq, Lookups(), ["/a"], False, bus.epoch) for seq in (1, 2, 0))
    for w in (first, second, stale):
        reg.capture(w)
    reg.park(first)
    assert reg.park(second) == (True, [first])
    assert first.stage is S.ENDED and second.stage is S.PARKED and reg.parked == 1
    assert reg.park(stale) == (False, []) and stale.stage is S.LEFT and stale.held is None
    assert reg.parked == 1 and reg.by_id == {"c": second}
    reg.finish(second)
    assert reg.parked == 0 and not reg.index


def test_an_immediate_answer_leaves_the_registry(bus: Bus) -> None:
    bus.publish("/a", "old")
    proto = P.MessageBusProtocol(bus, P.Options())
    poll = proto.start_poll(P.PollRequest("c", {"/a": 0}, http11=False), P.Lookups(), [])
    assert poll.mode == "immediate" and proto.registry.parked == 0 and not proto.registry.index


def test_a_stale_stream_ends_at_once(bus: Bus) -> None:
    proto = P.MessageBusProtocol(bus, P.Options())
    newer = proto.start_poll(P.PollRequest("c", {"/a": None}, seq=5, http11=True), P.Lookups(), [])
    older = proto.start_poll(P.PollRequest("c", {"/a": None}, seq=4, http11=True), P.Lookups(), [])
    assert newer.waiter is not None and older.waiter is not None
    assert older.waiter.stage is S.ENDED and older.waiter.ending is Ending.STALE
    assert newer.waiter.stage is S.PARKED
    proto.end(newer.waiter, Ending.DROPPED)
    assert newer.waiter.stage is S.ENDING and newer.waiter.dropped
    assert proto.stream_end(newer.waiter) == [] and newer.waiter.stage is S.ENDED
    proto.abandon(newer.waiter)
    proto.abandon(older.waiter)
    assert proto.registry.parked == 0 and not proto.registry.index
