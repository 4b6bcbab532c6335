"""The async client under both of anyio's backends, asyncio and trio, against real servers: ``async with client:``
runs its tasks in the block's own task group, so under trio as under asyncio it subscribes and receives, reads a
backlog from a position (and saves where it got to), runs hooks and backpressure, leaves no task behind however
its block ends, and rides out a restart of its server. ``start()`` outside such a block is asyncio's only.

Waits are bounded and generous (:func:`until`); nothing here measures time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

from shmbus.client import AsyncMessageBusClient, FilePositionStore, Message

from .conftest import FAST
from .servers import Target
from .stub import Reply, Seen, Stub

pytestmark = pytest.mark.anyio
#: a generous bound on each wait (a loaded machine passes: it is never a measure)
BOUND = 30.0


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def until(pred: Callable[[], Any], what: str, timeout: float = BOUND) -> None:
    """Wait until ``pred()`` is true (checked every 20 ms), at most ``timeout`` seconds."""
    with anyio.move_on_after(timeout):
        while not pred():
            await anyio.sleep(0.02)
        return
    raise AssertionError(f"timed out waiting for {what}")


def task_ids() -> set[int]:
    return {t.id for t in anyio.get_running_tasks()}


def client(url: str, **options: Any) -> AsyncMessageBusClient:
    return AsyncMessageBusClient(url, **{**FAST, **options})


async def test_subscribe_receive_and_listen(server: Target, channel: str) -> None:
    got: list[Message] = []
    async with client(server.url) as bus:
        assert bus.status == "started"
        bus.subscribe(channel, got.append)
        await until(lambda: bus.positions.get(channel, -1) >= 0, "the channel's position")
        ids = [server.publish(channel, i) for i in range(3)]
        await until(lambda: len(got) == 3, "three messages")
        listened: list[int] = []
        async for msg in bus.listen(channel, last_id=ids[0]):  # a second subscription, after the first message
            listened.append(msg.message_id)
            if len(listened) == 2:
                break
        await bus.stop()  # and started again in the same block (its task group)
        ids.append(server.publish(channel, "while stopped"))
        await bus.start()
        await until(lambda: len(got) == 4, "the message published while stopped")
    assert bus.status == "stopped"
    assert [m.message_id for m in got] == ids and [m.data for m in got] == [0, 1, 2, "while stopped"]
    assert listened == ids[1:3]


async def test_stop_ends_a_listen_loop(server: Target, channel: str) -> None:
    listened: list[int] = []
    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as group, client(server.url) as bus:

            async def consume() -> None:
                async for msg in bus.listen(channel):
                    listened.append(msg.message_id)
                listened.append(-1)  # the loop ended

            group.start_soon(consume)
            await until(lambda: bus.positions.get(channel, -1) >= 0, "the channel's position")
            mid = server.publish(channel, "one")
            await until(lambda: listened == [mid], "the message")
            await bus.stop()
    assert listened == [mid, -1]


async def test_a_subscribe_aborts_the_poll_in_flight() -> None:
    """The stub holds the first poll until the end of the test (the read timeout is longer still): a second poll,
    with the new channel, can only come from the first one being aborted. The later polls are answered at once and,
    with ``min_poll_interval=0``, follow at once (as on a loaded machine, where the second outlasts the interval):
    the count may pass 2 between two looks, so the wait is for at least 2."""
    release = threading.Event()

    def script(seen: Seen, n: int) -> Reply:
        if n == 0:
            release.wait(BOUND * 2)
        return Reply(pieces=[b"[]"])

    with Stub(script) as stub:
        try:
            async with client(stub.url, chunked=False, timeout=BOUND * 3, min_poll_interval=0) as bus:
                bus.subscribe("/a", lambda m: None, 0)
                await until(lambda: len(stub.seen) == 1, "the first poll")
                bus.subscribe("/b", lambda m: None, 0)
                await until(lambda: len(stub.seen) >= 2, "the poll after the subscribe")
        finally:
            release.set()
    assert set(stub.seen[1].form) - {"__seq"} == {"/a", "/b"}


async def test_a_backlog_from_a_position_with_backpressure_and_a_store(
    server: Target, channel: str, tmp_path: Path
) -> None:
    """20 in the backlog read from the second one's id, ``max_pending=5``: the first callback waits until the poll
    loop has stopped reading; all arrive in order, and the store holds the last position after the block."""
    ids = [server.publish(channel, i) for i in range(20)]
    store = FilePositionStore(tmp_path / "positions.json")
    got: list[int] = []
    bus = client(server.url, max_pending=5, position_store=store, save_interval=0.05)

    async def slow(msg: Message) -> None:
        if msg.message_id == ids[2]:
            await until(lambda: bus.stats.backpressure >= 1, "the poll loop to wait for the callbacks")
        got.append(msg.message_id)

    async with bus:
        bus.subscribe(channel, slow, ids[1])
        await until(lambda: len(got) == 18, "the backlog after the second message")
        await until(lambda: store.load() == {channel: ids[-1]}, "a save while the client runs")
        ids.append(server.publish(channel, "live"))
        await until(lambda: len(got) == 19, "the live message")
    assert got == ids[2:] and bus.stats.dropped == 0
    assert store.load() == {channel: ids[-1]}


async def test_hooks_plain_and_coroutine_and_one_that_fails(server: Target, channel: str) -> None:
    connects: list[str] = []
    resets: list[str] = []

    async def on_connect() -> None:
        await anyio.sleep(0)
        connects.append("connected")
        raise RuntimeError("this coroutine hook always fails")

    def on_reset(reset: Any) -> None:
        resets.append(reset.channel)

    old = server.publish(channel, "old")
    got: list[int] = []
    async with client(server.url, on_connect=on_connect, on_reset=on_reset) as bus:
        bus.subscribe(channel, lambda m: got.append(m.message_id), 10_000_000)  # ahead of the server: a reset
        await until(lambda: got == [old], "the message read again from 0")
        await until(lambda: bus.stats.hook_errors >= 1, "the coroutine hook's failure, counted")
    assert resets == [channel]
    assert bus.stats.hook_errors == len(connects) >= 1  # once, unless a poll failed and the client reconnected


async def test_no_task_is_left_however_the_client_ends(server: Target, channel: str, anyio_backend: str) -> None:
    """A stop in the block, the block left by an exception (which comes out as itself, not in a group), the block
    cancelled from outside, and stop() awaited in a callback: each time a coroutine hook is still running."""
    before = task_ids()
    hooked = anyio.Event()

    async def hang() -> None:  # a coroutine hook still running when the client stops: cancelled with it
        hooked.set()
        await anyio.sleep_forever()

    async with client(server.url, on_connect=hang) as bus:
        bus.subscribe(channel, lambda m: None)
        await hooked.wait()
        await bus.stop()
        assert task_ids() == before and bus.status == "stopped"
    assert task_ids() == before

    with pytest.raises(ValueError, match="in the block"):
        async with client(server.url, on_connect=hang) as bus:
            bus.subscribe(channel, lambda m: None)
            raise ValueError("in the block")
    assert task_ids() == before

    with anyio.move_on_after(BOUND) as outer:
        async with client(server.url, on_connect=hang) as bus:
            bus.subscribe(channel, lambda m: None)
            await until(lambda: bus.positions.get(channel, -1) >= 0, "the channel's position")
            outer.cancel()
            await anyio.sleep_forever()
    assert outer.cancelled_caught and task_ids() == before

    got: list[int] = []

    async def stop_at_first(msg: Message) -> None:
        got.append(msg.message_id)
        await bus.stop()  # returns (no cancellation raised here): the run ends when this callback returns
        got.append(-1)

    two = [server.publish(channel, i) for i in range(2)]
    async with client(server.url) as bus:
        bus.subscribe(channel, stop_at_first, two[0] - 1)
        await until(lambda: bus.status == "stopped", "the stop from the callback")
        await until(lambda: task_ids() == before, "the run's end")
    assert got == [two[0], -1] and task_ids() == before


async def test_start_and_stop_outside_a_block_are_asyncios(server: Target, channel: str, anyio_backend: str) -> None:
    bus = client(server.url)
    got: list[Message] = []
    bus.subscribe(channel, got.append)
    if anyio_backend == "trio":
        with pytest.raises(RuntimeError, match="async with"):
            await bus.start()
        assert bus.status == "new"
        return
    before = task_ids()
    await bus.start()
    await until(lambda: bus.positions.get(channel, -1) >= 0, "the channel's position")
    mid = server.publish(channel, "one")
    await until(lambda: len(got) == 1, "the message")
    await bus.stop()
    assert task_ids() == before and [m.message_id for m in got] == [mid]


@pytest.mark.slow
async def test_the_server_restarted_under_the_client(new_target: Callable[..., Target]) -> None:
    """Killed (SIGKILL) with a poll in flight, then started again: the coroutine ``on_error`` hook hears of the
    failures, ``on_connect`` of the reconnection, and every message arrives once and in order, those published
    while the server was down included."""
    target = new_target("lean")
    errors: list[Exception] = []
    connects: list[int] = []

    async def on_error(error: Exception, retry_in: float) -> None:
        errors.append(error)

    got: list[int] = []
    async with client(target.url, on_error=on_error, on_connect=lambda: connects.append(1)) as bus:
        bus.subscribe("/restart", lambda m: got.append(m.message_id))
        await until(lambda: bus.positions.get("/restart", -1) >= 0, "the channel's position")
        ids = [target.publish("/restart", "before")]
        await until(lambda: got == ids, "the message before the restart")
        await anyio.to_thread.run_sync(target.kill)
        ids.append(target.publish("/restart", "while down"))
        await until(lambda: errors, "a failed poll")
        await anyio.to_thread.run_sync(target.start)
        await until(lambda: got == ids, "the message published while the server was down")
        ids.append(target.publish("/restart", "after"))
        await until(lambda: got == ids, "the message after the restart")
        assert len(connects) >= 2 and bus.stats.failures >= 1
