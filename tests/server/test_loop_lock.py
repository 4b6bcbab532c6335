"""The lean server's loop (``shmbus.adapters.loop_lock``): its thread holds a lock outside ``select``, so a small
fan-out is made on the bus listener thread while the loop idles (no thread switch to the loop per message), and
only the writes to parked streams are made there: a long poll's answer, a busy loop and a large fan-out stay the
loop's."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, cast

from shmbus import Bus
from shmbus.adapters.asgi import MessageBusMiddleware
from shmbus.adapters.fanout import SMALL_FANOUT, LoopFanout
from shmbus.adapters.loop_lock import held_outside_select, new_loop
from shmbus.adapters.server import Server
from shmbus.adapters.server.serve import connection_factory

from .mock_transport import FakeTransport
from .rig import LIMITS, LONG_POLL, EchoApp, delivered
from .wire import poll


class Threaded(FakeTransport):
    """Records which thread made each write."""

    def __init__(self, loop: Any, log: list[tuple[str, str, bytes]], name: str) -> None:
        super().__init__(loop)
        self.log = log
        self.name = name

    def write(self, data: bytes) -> None:
        super().write(data)
        self.log.append((self.name, threading.current_thread().name, bytes(data)))


def run_on_new_loop(body: Callable[[asyncio.AbstractEventLoop], Any]) -> None:
    loop = new_loop()
    try:
        loop.run_until_complete(asyncio.wait_for(body(loop), 60))
    finally:
        loop.close()


@contextlib.contextmanager
def serving(
    loop: asyncio.AbstractEventLoop, bus: Bus, polls: dict[str, tuple[dict[str, object], bool]]
) -> Iterator[tuple[LoopFanout, list[tuple[str, str, bytes]]]]:
    """The lean server on ``loop`` with a poll parked per name (its channels, chunked or not), on transports that
    log (name, thread, bytes) of every write after they parked; the loop's fan-out and that log."""
    mw = MessageBusMiddleware(EchoApp(), bus=bus, long_polling_interval=LONG_POLL, batch_window=0)
    try:
        srv = Server(mw, loop, limits=LIMITS)
        log: list[tuple[str, str, bytes]] = []
        for name, (channels, chunk) in polls.items():
            t = Threaded(loop, log, name)
            t.connect(connection_factory(srv)())
            t.receive(poll(name, channels, chunk=chunk))
        log.clear()
        yield cast(LoopFanout, mw._fanout()), log
    finally:
        mw.close()


def test_a_loop_made_here_is_locked_outside_select_only() -> None:
    async def body(loop: asyncio.AbstractEventLoop) -> None:
        lock = held_outside_select(loop)
        assert lock is not None and not lock.acquire(blocking=False), "free while the loop's thread runs"
        got = []

        def take() -> None:  # another thread, while this loop waits in select for its answer
            got.append(lock.acquire(timeout=10))
            if got[-1]:
                lock.release()

        await loop.run_in_executor(None, take)
        assert got == [True]

    run_on_new_loop(body)
    assert held_outside_select(asyncio.new_event_loop()) is None  # any other loop


def test_a_chat_message_is_written_by_the_listener_while_the_loop_idles(shared_bus: Bus) -> None:
    async def body(loop: asyncio.AbstractEventLoop) -> None:
        last = {"/room": shared_bus.last_id("/room")}
        with serving(loop, shared_bus, {"stream": (last, True), "long": (last, False)}) as (eng, log):
            assert eng.inline is not None
            shared_bus.publish("/room", "CHAT-1")
            await delivered(lambda: sum(b"CHAT-1" in d for _, _, d in log) == 2)
            who = {name: thread for name, thread, data in log if b"CHAT-1" in data}
            assert who["stream"].startswith("shmbus-listener"), f"the stream's write was made on {who['stream']}"
            assert who["long"] == threading.current_thread().name, "a long poll's answer left the loop's thread"

    run_on_new_loop(body)


def test_a_busy_loop_and_a_large_fan_out_stay_the_loop_s(shared_bus: Bus) -> None:
    async def body(loop: asyncio.AbstractEventLoop) -> None:
        names = [f"b{i}" for i in range(SMALL_FANOUT + 1)]
        polls: dict[str, tuple[dict[str, object], bool]] = dict.fromkeys(
            names, ({"/bcast": shared_bus.last_id("/bcast")}, True)
        )
        polls["room"] = ({"/room": shared_bus.last_id("/room")}, True)
        with serving(loop, shared_bus, polls) as (eng, log):
            shared_bus.publish("/bcast", "BCAST-1")  # more clients than a small fan-out
            await delivered(lambda: sum(b"BCAST-1" in d for _, _, d in log) == len(names))
            busy = threading.Event()
            wake_loop = eng._wake_loop

            def tell() -> None:
                wake_loop()
                busy.set()

            eng._wake_loop = tell  # type: ignore[method-assign]
            shared_bus.publish("/room", "CHAT-1")
            assert busy.wait(10)  # the loop's thread never left this coroutine (it holds its lock): busy
            await delivered(lambda: any(b"CHAT-1" in d for _, _, d in log))
            me = threading.current_thread().name
            assert {thread for _, thread, d in log if b"BCAST-1" in d or b"CHAT-1" in d} == {me}

    run_on_new_loop(body)
