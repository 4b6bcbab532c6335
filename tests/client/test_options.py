"""The client's options for what it sends and what its callbacks get: ``headers`` from a callable (a rotating
token), a ``decoder`` of each message's data, and a bounded callback queue (``max_pending`` with ``overflow``
"block" or "drop_oldest"), against the lean worker and the gem; the backpressure's "no next poll until the
callbacks caught up" on the scripted stub, which records when each poll came."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from shmbus.client import AsyncMessageBusClient, HeadersFailed, Message, MessageBusClient

from .recorder import Recorder, resolved, wait_until
from .servers import Target
from .stub import Reply, Seen, Stub

pytestmark = pytest.mark.slow
MakeClient = Callable[..., MessageBusClient]


def test_headers_from_a_callable_are_read_before_each_poll(
    server: Target, make_client: MakeClient, channel: str
) -> None:
    """A token that rotates: each poll says who is asking as of now (the servers look the user up per request)."""
    who = {"X-User-Id": "5"}
    calls: list[str] = []

    def headers() -> dict[str, str]:
        calls.append(who["X-User-Id"])
        return dict(who)

    client = make_client(server.url, headers=headers)
    rec = Recorder()
    client.subscribe(channel, rec)
    resolved(client, channel)
    first = server.publish(channel, "for 5", user_ids=[5])
    rec.wait(1)
    who["X-User-Id"] = "6"
    client.subscribe(channel + "/poke", Recorder())  # a subscribe ends the poll in flight: the next asks as 6
    wait_until(lambda: calls[-1] == "6", what="a poll as user 6")
    server.publish(channel, "for 5 again", user_ids=[5])
    second = server.publish(channel, "for 6", user_ids=[6])
    last = server.publish(channel, "everyone")
    rec.wait(3)
    wait_until(lambda: last in rec.ids, what="the public message")
    assert rec.ids == [first, second, last]
    assert len(calls) >= client.stats.polls  # (one call per poll sent)


def test_a_headers_callable_that_raises_is_a_failed_poll(server: Target, channel: str) -> None:
    """On the async client, with a coroutine function: its first call raises, the client backs off and goes on."""
    failures: list[Exception] = []
    calls = [0]

    async def headers() -> dict[str, str]:
        calls[0] += 1
        if calls[0] == 1:
            raise ConnectionError("the token service is down")
        return {"X-User-Id": "9"}

    async def main() -> list[int]:
        got: list[Message] = []
        async with AsyncMessageBusClient(
            server.url, min_poll_interval=0.05, timeout=10, headers=headers, on_error=lambda e, _: failures.append(e)
        ) as client:
            client.subscribe(channel, got.append)
            while client.positions.get(channel, -1) < 0:
                await asyncio.sleep(0.02)
            ids = [server.publish(channel, "for 9", user_ids=[9]), server.publish(channel, "all")]
            while len(got) < 2:
                await asyncio.sleep(0.02)
            assert client.stats.failures == 1 and "token service is down" in str(client.stats.last_error)
            assert [m.message_id for m in got] == ids
            return ids

    asyncio.run(asyncio.wait_for(main(), 30))
    assert len(failures) == 1 and isinstance(failures[0], HeadersFailed)
    assert isinstance(failures[0].__cause__, ConnectionError)


@dataclass(frozen=True)
class Point:
    x: int
    y: int


def test_a_decoder_turns_data_into_objects_once_per_message_and_skips_what_it_cannot(
    server: Target, make_client: MakeClient, channel: str
) -> None:
    decoded: list[Any] = []

    def decoder(data: Any) -> Point:
        decoded.append(data)
        return Point(**data)

    client = make_client(server.url, decoder=decoder)
    a, b = Recorder(), Recorder()
    subs = [client.subscribe(channel, a), client.subscribe(channel, b)]
    resolved(client, channel, subs=subs)
    ids = [server.publish(channel, {"x": 1, "y": 2}), server.publish(channel, "garbage")]
    ids.append(server.publish(channel, {"x": 3, "y": 4}))
    a.wait(2)
    b.wait(2)
    wait_until(lambda: client.positions[channel] == ids[-1], what="the position past the last one")
    assert a.data == b.data == [Point(1, 2), Point(3, 4)]
    assert a.ids == [ids[0], ids[2]]
    assert len(decoded) == 3  # once per message, not once per subscription
    assert client.stats.decode_errors == 1 and client.stats.callback_errors == 0


def test_drop_oldest_keeps_the_newest_and_counts_the_rest(
    server: Target, make_client: MakeClient, channel: str
) -> None:
    """A backlog of 20 read from 0 comes in one answer: 15 of it over ``max_pending`` are dropped."""
    ids = [server.publish(channel, i) for i in range(20)]
    client = make_client(server.url, max_pending=5, overflow="drop_oldest")
    rec = Recorder()
    client.subscribe(channel, rec, 0)
    rec.wait(5)
    live = server.publish(channel, "live")
    rec.wait(6)
    assert rec.ids == [*ids[-5:], live]
    assert client.stats.dropped == 15 and client.stats.backpressure == 0


def test_block_holds_the_reading_until_the_callbacks_catch_up(server: Target, channel: str) -> None:
    """The first callback waits until the poll loop has stopped reading (stats.backpressure): nothing is lost."""
    ids = [server.publish(channel, i) for i in range(20)]

    async def main() -> tuple[list[int], int, int]:
        got: list[int] = []
        client = AsyncMessageBusClient(server.url, callback_interval=0.3, timeout=10, max_pending=5)

        async def slow(msg: Message) -> None:
            while msg.message_id == ids[0] and client.stats.backpressure == 0:
                await asyncio.sleep(0.02)
            got.append(msg.message_id)

        async with client:
            client.subscribe(channel, slow, 0)
            while len(got) < 20:
                await asyncio.sleep(0.02)
            ids.append(server.publish(channel, "live"))
            while len(got) < 21:
                await asyncio.sleep(0.02)
            return got, client.stats.backpressure, client.stats.dropped

    got, backpressure, dropped = asyncio.run(asyncio.wait_for(main(), 30))
    assert got == ids and backpressure >= 1 and dropped == 0


def test_block_sends_no_poll_until_the_callbacks_catch_up() -> None:
    """A stub answers the first poll with 20 messages; the first callback waits until the client blocks or polls
    again. With max_pending=5 the second poll comes only once 16 callbacks have started."""
    batch = [{"channel": "/bp", "data": i, "message_id": i, "global_id": i} for i in range(1, 21)]

    def script(seen: Seen, n: int) -> Reply:
        return Reply(pieces=[json.dumps(batch).encode()] if n == 0 else [0.2, b"[]"])

    async def main(stub: Stub) -> list[tuple[int, int]]:
        started: list[tuple[int, int]] = []  # (message id, polls the stub had seen)
        client = AsyncMessageBusClient(stub.url, min_poll_interval=0.01, max_pending=5)

        async def callback(msg: Message) -> None:
            started.append((msg.message_id, len(stub.seen)))
            while msg.message_id == 1 and client.stats.backpressure == 0 and len(stub.seen) < 2:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0)

        async with client:
            client.subscribe("/bp", callback, 0)
            while len(started) < 20:
                await asyncio.sleep(0.01)
        return started

    with Stub(script) as stub:
        started = asyncio.run(asyncio.wait_for(main(stub), 30))
    assert [mid for mid, _ in started] == list(range(1, 21))
    assert [polls for mid, polls in started if mid <= 16] == [1] * 16, started


def test_bounded_queue_options_are_checked() -> None:
    with pytest.raises(ValueError, match="max_pending"):
        MessageBusClient("http://127.0.0.1:9", max_pending=0)
    with pytest.raises(ValueError, match="overflow"):
        MessageBusClient("http://127.0.0.1:9", max_pending=5, overflow="drop_newest")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="decoder"):
        MessageBusClient("http://127.0.0.1:9", decoder="json")  # type: ignore[arg-type]
