"""A loop's fan-out (``shmbus.adapters.fanout``): a large fan-out wakes its clients in slices sized by time, a
message to a few clients overtakes it, and no client ever gets its pieces out of order or twice.

The unit tests drive :class:`LoopFanout` on a :class:`~mock_transport.FakeLoop` with a fake clock and fake
wake-ups; the last test runs the lean server's connections on fake transports over a real bus, where each write
moves the fan-out's fake clock, and shows a chat message written before the rest of a broadcast under way.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, cast

import pytest

from shmbus import Bus
from shmbus.adapters.asgi import MessageBusMiddleware
from shmbus.adapters.fanout import SLICE_BUDGET, SLICE_STEP, SMALL_FANOUT, WINDOW_STRETCH, LoopFanout
from shmbus.adapters.http import Lookups, MessageBusProtocol, Options, Waiter
from shmbus.adapters.http.group import DEFER_OVER
from shmbus.adapters.http.protocol import null_lock
from shmbus.adapters.http.registry import Registry
from shmbus.adapters.server import Server
from shmbus.adapters.server.serve import connection_factory
from shmbus.message import Message

from .mock_transport import FakeLoop, FakeTransport
from .rig import LIMITS, LONG_POLL, EchoApp, in_loop
from .wire import poll


class Clock:
    """The fan-out's clock: it moves only when a wake-up (a write) spends time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fanout(bus: Bus, window: float = 0.002) -> tuple[LoopFanout, FakeLoop, Clock]:
    loop = FakeLoop()
    eng = LoopFanout(bus, Options(batch_window=window), cast(asyncio.AbstractEventLoop, loop))
    clock = eng.clock = Clock()
    return eng, loop, clock


def fake_wakes(eng: LoopFanout, clock: Clock, cost: list[float]) -> list[Any]:
    """Replace the protocol's wake-up: it records the client and spends ``cost[0]`` seconds of the clock."""
    woken: list[Any] = []

    def wake(c: Any) -> None:
        woken.append(c)
        clock.now += cost[0]

    eng.proto.wake = wake  # type: ignore[method-assign]
    return woken


def dispatch_to(eng: LoopFanout, clients: list[Any], took: float = 0.0) -> None:
    """Queue a batch whose dispatch (``took`` seconds of the clock) returns ``clients`` to wake."""
    clock = cast(Clock, eng.clock)

    def deliver(batches: Any, deferred: Any = None) -> list[Any]:
        clock.now += took
        return clients

    eng.proto.deliver_batches = deliver  # type: ignore[method-assign]
    eng.batches.append([])


def test_a_large_fan_out_wakes_in_slices_sized_by_time(shared_bus: Bus) -> None:
    """Slices last about SLICE_BUDGET whatever a wake-up costs (the clock is read every SLICE_STEP wake-ups);
    every client is woken once, in order; each next slice waits for a turn of the loop."""
    assert (SLICE_BUDGET, SLICE_STEP) == (0.001, 8), "the slice sizes below assume these"
    eng, loop, clock = fanout(shared_bus)
    cost = [0.0001]
    woken = fake_wakes(eng, clock, cost)
    clients = list(range(300))
    dispatch_to(eng, clients)
    eng.drain()
    assert len(woken) == 16, "100 µs a wake-up: 16 fill the 1 ms budget (looked at every 8)"
    assert [t.when for t in loop.pending()] == [loop.now], "the next slice is not a timer due now"
    loop.turn()
    assert len(woken) == 32
    cost[0] = 0.00002
    loop.turn()
    assert len(woken) == 32 + 56, "20 µs a wake-up: 56 to the budget"
    cost[0] = 0.01
    loop.turn()
    assert len(woken) == 32 + 56 + SLICE_STEP, "a slow wake-up: one step, then the loop's other work"
    for _ in range(100):
        loop.turn()
    assert woken == clients and not loop.pending() and not eng.runs


def test_a_small_fan_out_is_woken_whole_ahead_of_the_large_ones_under_way(shared_bus: Bus) -> None:
    """A drain for a few clients wakes them at once, in the middle of a broadcast's slices; a second large
    fan-out waits for the first; the first goes on where it was."""
    eng, loop, clock = fanout(shared_bus)
    woken = fake_wakes(eng, clock, [0.0001])
    bcast = [f"b{i}" for i in range(100)]
    dispatch_to(eng, bcast)
    eng.drain()
    assert woken == bcast[:16]
    chat = [f"c{i}" for i in range(SMALL_FANOUT)]
    dispatch_to(eng, chat)
    eng.drain()
    assert woken == bcast[:16] + chat, "the chat's clients were not woken at once"
    second = [f"s{i}" for i in range(100)]
    dispatch_to(eng, second)
    eng.drain()
    assert woken == bcast[:16] + chat, "a second large fan-out started while the first was under way"
    for _ in range(100):
        loop.turn()
    assert woken == bcast[:16] + chat + bcast[16:] + second
    assert len(loop.pending()) == 0


def _no_op(msgs: list[Message]) -> None:
    pass


def _msg(bus: Bus, channel: str) -> Message:
    return Message(1, 1, channel, b'"x"', bus.codec)


def test_the_window_stretches_after_a_long_fan_out_for_many_clients_only(shared_bus: Bus) -> None:
    """After a fan-out longer than ``batch_window`` the next batches for many clients gather for as long (at most
    WINDOW_STRETCH windows); batches for a few clients keep ``batch_window``, or are drained at once while the bus
    listener lingers that long after each batch (it spaces them already); a quick fan-out restores the window."""
    eng, loop, clock = fanout(shared_bus, window=0.002)
    fake_wakes(eng, clock, [0.0002])
    dispatch_to(eng, list(range(60)), took=0.001)  # small: woken at once, 13 ms in all
    eng.drain()
    assert eng.wait == pytest.approx(0.013)
    dispatch_to(eng, list(range(500)), took=0.001)  # 101 ms in slices
    eng.drain()
    for _ in range(200):
        loop.turn()
    assert not eng.runs and eng.wait == pytest.approx(0.002 * WINDOW_STRETCH)
    index = eng.proto.registry.index
    index[(None, "/bcast")] = set(range(500))  # type: ignore[arg-type]
    index[(None, "/room")] = set(range(3))  # type: ignore[arg-type]
    drained: list[Any] = []
    eng.drain = lambda: drained.append(eng.batches)  # type: ignore[method-assign]
    for channel, wait in (("/room", 0.002), ("/bcast", 0.002 * WINDOW_STRETCH)):  # the listener does not linger
        eng.batches = [[_msg(shared_bus, channel)]]
        eng._drain_soon()
        assert loop.pending()[-1].when - loop.now == pytest.approx(wait), channel
        loop.pending()[-1].cancel()
    shared_bus.tap(_no_op, 0.002)  # as the middleware's own tap: the listener lingers the window after a batch
    try:
        eng.batches = [[_msg(shared_bus, "/room")]]
        eng._drain_soon()
        assert drained and not loop.pending(), "a batch for a few clients waited for a window the listener had"
        eng.batches = [[_msg(shared_bus, "/bcast")]]
        eng._drain_soon()
        assert len(drained) == 1 and loop.pending()[-1].when - loop.now == pytest.approx(0.002 * WINDOW_STRETCH)
        loop.pending()[-1].cancel()
    finally:
        shared_bus.untap(_no_op)
    del eng.drain
    eng.batches = [[_msg(shared_bus, "/room")], [_msg(shared_bus, "/bcast")]]
    assert not eng.few_queued(), "a chat batch queued with a broadcast's was drained without the broadcast's window"
    dispatch_to(eng, [])
    eng.drain()
    assert eng.wait == 0.002, "a quick fan-out did not restore the window"
    zero, _, _ = fanout(shared_bus, window=0.0)
    dispatch_to(zero, [], took=0.005)
    zero.drain()
    assert zero.wait == 0


# ---------------------------------------------------------------------------------------------------- deferred
def _streams(bus: Bus, reg: Registry, channels: dict[str, list[str]]) -> dict[str, Waiter]:
    """Parked streams by name, each on its channels from their current last ids."""
    out = {}
    for name, chans in channels.items():
        c = Waiter(name, 1, Lookups(), chans, True, bus.epoch)
        for ch in chans:
            c.last[ch] = bus.last_id(ch)
        reg.capture(c)
        assert reg.park(c)[0]
        out[name] = c
    return out


def _published(bus: Bus, channel: str, data: str) -> list[Message]:
    last = bus.last_id(channel)
    bus.publish(channel, data)
    return list(bus.backlog(channel, last))


def test_a_deferred_delivery_gives_a_client_its_piece_before_anything_newer(shared_bus: Bus) -> None:
    """A channel with more than DEFER_OVER clients is set aside at dispatch (nothing queued yet) and delivered a
    step at a time; a chat message for a client it has not reached yet gives that client the broadcast first
    (then the chat), and the rest of the broadcast skips it; a client that ends meanwhile gets its piece with its
    end. Every stream gets the broadcast once."""
    proto = MessageBusProtocol(shared_bus, Options(), null_lock())
    reg = proto.registry
    plan = {f"b{i}": ["/bcast"] for i in range(DEFER_OVER + 36)}
    plan |= {"both": ["/bcast", "/room"], "ends": ["/bcast"]}
    streams = _streams(shared_bus, reg, plan)
    deferred: list[Any] = []
    assert reg.dispatch(_published(shared_bus, "/bcast", "BCAST"), deferred) == []
    assert len(deferred) == 1 and not any(c.pending for c in streams.values()), "the broadcast was not deferred"
    d = deferred[0]
    order = list(d.clients)
    both, ends = streams["both"], streams["ends"]
    first = min(order.index(both), order.index(ends))
    woken = reg.serve(d, first)
    assert woken == order[:first] and all(b"BCAST" in c.pending[0] for c in woken)
    assert not both.pending and not ends.pending
    assert reg.dispatch(_published(shared_bus, "/room", "CHAT"), deferred) == [both] and len(deferred) == 1
    assert len(both.pending) == 2 and b"BCAST" in both.pending[0] and b"CHAT" in both.pending[1], (
        "the chat message overtook the broadcast on a stream that has both"
    )
    pending, _ = reg.finish(ends)
    assert len(pending) == 1 and b"BCAST" in pending[0], "an ending stream lost the broadcast it was owed"
    rest = reg.serve(d, len(order))
    assert both not in rest and ends not in rest and d not in reg.owed
    assert sorted(c.client_id for c in woken + rest) == sorted(n for n in plan if n not in ("both", "ends"))
    for c in streams.values():
        if c is not ends:
            assert sum(p.count(b"BCAST") for p in c.pending) == 1, c


def test_a_small_channel_is_not_deferred(shared_bus: Bus) -> None:
    """DEFER_OVER clients on a channel: delivered at once, even when a caller takes deferred ones."""
    reg = MessageBusProtocol(shared_bus, Options(), null_lock()).registry
    streams = _streams(shared_bus, reg, {f"r{i}": ["/room"] for i in range(DEFER_OVER)})
    deferred: list[Any] = []
    assert len(reg.dispatch(_published(shared_bus, "/room", "CHAT"), deferred)) == DEFER_OVER and not deferred
    assert all(len(c.pending) == 1 for c in streams.values())


# ---------------------------------------------------------------------------------------------------- the server
class Wire:
    """Every write of every connection in order; each write spends 200 µs of the fan-out's clock."""

    def __init__(self) -> None:
        self.clock = Clock()
        self.log: list[tuple[str, bytes]] = []

    def transport(self, loop: FakeLoop, name: str) -> FakeTransport:
        wire = self

        class Timed(FakeTransport):
            def write(self, data: bytes) -> None:
                super().write(data)
                wire.log.append((name, bytes(data)))
                wire.clock.now += 0.0002

        return Timed(loop)

    def got(self, name: str) -> bytes:
        return b"".join(data for who, data in self.log if who == name)


STREAMS = 100  # more than SMALL_FANOUT


@in_loop
async def test_a_chat_message_is_written_before_the_rest_of_a_broadcast_under_way(shared_bus: Bus) -> None:
    """100 streams on the broadcast channel, one on a chat room only, one on both (``batch_window=0``). The
    broadcast's first slice (1 ms: 8 writes of 200 µs) goes out; the chat message published then is written on
    the loop's next turn, before the broadcast's next slice; every stream gets each message once, and the stream
    on both channels gets the broadcast before the chat message."""
    mw = MessageBusMiddleware(EchoApp(), bus=shared_bus, long_polling_interval=LONG_POLL, batch_window=0)
    try:
        loop = FakeLoop()
        srv = Server(mw, cast(asyncio.AbstractEventLoop, loop), limits=LIMITS)
        wire = Wire()
        last = {"/bcast": shared_bus.last_id("/bcast"), "/room": shared_bus.last_id("/room")}
        names = [f"b{i}" for i in range(STREAMS)] + ["room", "both"]
        for name in names:
            t = wire.transport(loop, name)
            t.connect(connection_factory(srv)())
            channels = {"/room": last["/room"]} if name == "room" else {"/bcast": last["/bcast"]}
            if name == "both":
                channels = dict(last)
            t.receive(poll(name, channels, chunk=True))
        assert all(wire.got(n).startswith(b"HTTP/1.1 200 OK") for n in names), "a stream did not park"
        wire.log.clear()
        eng = cast(LoopFanout, mw._fanout())
        eng.clock = wire.clock
        queued = threading.Event()
        wake_loop = eng._wake_loop

        def wake_and_tell() -> None:
            wake_loop()
            queued.set()  # the listener thread queued the batch and (going idle) scheduled its drain

        eng._wake_loop = wake_and_tell  # type: ignore[method-assign]

        shared_bus.publish("/bcast", "BCAST-1")
        assert queued.wait(10), "the broadcast never reached the loop's fan-out"
        queued.clear()
        await asyncio.sleep(0)  # one turn: the drain dispatches and writes the first slice
        first = [who for who, _ in wire.log]
        assert 0 < len(first) < STREAMS, f"the broadcast was not sliced by time: {len(first)} writes in its first slice"
        held = [w for w in eng.proto.registry.by_id.values() if w.pending]
        assert not held, f"the broadcast's dispatch was not sliced: {len(held)} streams hold its piece unwritten"
        shared_bus.publish("/room", "CHAT-1")
        assert queued.wait(10), "the chat message never reached the loop's fan-out"
        await asyncio.sleep(0)  # the next turn: the chat's drain, then (a timer) the broadcast's next slice
        assert b"CHAT-1" in wire.got("room"), "the chat message waited for the broadcast"
        sent = [who for who, data in wire.log if b"BCAST-1" in data]
        assert len(sent) < STREAMS, "no broadcast write was left to overtake"
        for _ in range(200):
            if sum(b"BCAST-1" in wire.got(n) for n in names) == STREAMS + 1:
                break
            await asyncio.sleep(0)
        for name in names:
            got = wire.got(name)
            assert got.count(b"BCAST-1") == (name != "room") and got.count(b"CHAT-1") == (name in ("room", "both"))
        both = wire.got("both")
        assert both.index(b"BCAST-1") < both.index(b"CHAT-1"), "the chat message overtook the broadcast on a stream"
    finally:
        mw.close()


@in_loop
async def test_a_broadcast_is_written_straight_to_idle_streams_and_queued_for_a_paused_one(shared_bus: Bus) -> None:
    """The lean server's direct write (``Waiter.write_now``): a slice writes a broadcast's chunk to each stream with
    nothing queued as it serves it, with no wake-up; a stream whose transport paused writing gets it queued and
    written once when it resumes. Each stream gets the broadcast once."""
    mw = MessageBusMiddleware(EchoApp(), bus=shared_bus, long_polling_interval=LONG_POLL, batch_window=0)
    try:
        loop = FakeLoop()
        srv = Server(mw, cast(asyncio.AbstractEventLoop, loop), limits=LIMITS)
        wire = Wire()
        last = {"/bcast": shared_bus.last_id("/bcast")}
        names = [f"b{i}" for i in range(STREAMS)]
        conns = {}
        for name in names:
            t = wire.transport(loop, name)
            conns[name] = conn = connection_factory(srv)()
            t.connect(conn)
            t.receive(poll(name, last, chunk=True))
        wire.log.clear()
        woken: list[str] = []
        for w in mw._fanout().proto.registry.by_id.values():
            real = w.waker

            def counting(c: Waiter, real: Any = real) -> None:
                woken.append(c.client_id)
                real(c)

            w.waker = counting
        conns["b7"].pause_writing()
        shared_bus.publish("/bcast", "BCAST-1")
        for _ in range(2000):
            if sum(b"BCAST-1" in wire.got(n) for n in names) == STREAMS - 1:
                break
            await asyncio.sleep(0.001)
        assert all(wire.got(n).count(b"BCAST-1") == (n != "b7") for n in names)
        assert woken == ["b7"], "streams with nothing queued were queued and woken instead of written to"
        conns["b7"].resume_writing()
        assert wire.got("b7").count(b"BCAST-1") == 1, "the paused stream's queued piece was not written on resume"
    finally:
        mw.close()
