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
from shmbus.adapters.loop_lock import held_outside_select, new_loop, post
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


def test_a_busy_loop_is_given_a_chat_message_without_its_self_pipe(shared_bus: Bus) -> None:
    """The route that publishes runs on the loop: the listener finds that loop busy and posts the fan-out to it,
    which drains it before its next wait; waking it through the self-pipe cost a system call on the listener and
    a second pass through ``epoll_wait`` on the loop, for every chat message published from the worker's routes."""

    async def body(loop: asyncio.AbstractEventLoop) -> None:
        last = {"/room": shared_bus.last_id("/room")}
        with serving(loop, shared_bus, {"stream": (last, True)}) as (eng, log):
            woken: list[int] = []
            write_to_self = loop._write_to_self  # type: ignore[attr-defined]

            def counted() -> None:
                woken.append(1)
                write_to_self()

            loop._write_to_self = counted  # type: ignore[attr-defined]
            told = threading.Event()
            wake_loop = eng._wake_loop

            def tell() -> None:
                wake_loop()
                told.set()

            eng._wake_loop = tell  # type: ignore[method-assign]
            for n in range(3):
                told.clear()
                shared_bus.publish("/room", f"CHAT-{n}")  # as a route does, on the loop's thread
                assert told.wait(10)  # the listener handed it over while this thread still ran: busy
                assert not any(f"CHAT-{n}".encode() in d for _, _, d in log)
                await delivered(lambda n=n: any(f"CHAT-{n}".encode() in d for _, _, d in log))
            assert woken == [], "the busy loop was woken through its self-pipe"

    run_on_new_loop(body)


def test_a_post_to_a_loop_that_may_be_waiting_is_refused() -> None:
    """Posting is for a loop outside ``select``: one waiting there (or about to) must be woken instead, else the
    work would wait for the next event."""

    async def body(loop: asyncio.AbstractEventLoop) -> None:
        ran: list[str] = []
        assert post(loop, lambda: ran.append("busy"))  # from its own thread, running: before its next wait
        await asyncio.sleep(0)  # the loop's next iteration takes it ...
        await asyncio.sleep(0)  # ... and runs it after this task's own step
        assert ran == ["busy"]
        answers: list[bool] = []
        lock = held_outside_select(loop)
        assert lock is not None

        def from_another_thread() -> None:
            assert lock.acquire(timeout=10)  # the loop is in select now (it let go of its lock) ...
            lock.release()  # ... and stays there: nothing wakes it until this function returns
            answers.append(post(loop, lambda: ran.append("waiting")))

        await loop.run_in_executor(None, from_another_thread)
        assert answers == [False] and ran == ["busy"]  # this loop waited in select for the executor's answer
        assert not post(asyncio.new_event_loop(), lambda: None)  # any other loop

    run_on_new_loop(body)
