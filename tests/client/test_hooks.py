"""The client's hooks (on_connect, on_error, on_reset, on_rate_limited) against real servers (the lean worker and the
gem), and a 429 from the scripted stub (no real server rate-limits on cue). Each hook is checked by what it was
told and how often, never by when."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest

from shmbus.client import AsyncMessageBusClient, MessageBusClient, Reset

from .recorder import Recorder, resolved, wait_until
from .servers import Target
from .stub import Reply, Seen, Stub

pytestmark = pytest.mark.slow
MakeClient = Callable[..., MessageBusClient]


class Calls:
    """A hook that records its arguments and the thread it ran on."""

    def __init__(self, fail: bool = False) -> None:
        self.args: list[tuple[Any, ...]] = []
        self.threads: set[str] = set()
        self.fail = fail

    def __call__(self, *args: Any) -> None:
        self.args.append(args)
        self.threads.add(threading.current_thread().name)
        if self.fail:
            raise RuntimeError("this hook always fails")


@pytest.mark.parametrize("kind", ["lean", "gem"])
def test_on_connect_and_on_error_through_a_server_restart(
    new_target: Callable[..., Target], make_client: MakeClient, kind: str
) -> None:
    target = new_target(kind)
    connects, errors = Calls(), Calls()
    client = make_client(target.url, on_connect=connects, on_error=errors)
    rec = Recorder()
    client.subscribe("/hooks", rec)
    resolved(client, "/hooks")
    wait_until(lambda: len(connects.args) == 1, what="on_connect")
    assert errors.args == []
    target.kill()
    wait_until(lambda: errors.args, what="on_error while the server is down")
    target.start()
    wait_until(lambda: len(connects.args) == 2, what="on_connect again once the server is back")
    mid = target.publish("/hooks", "after the restart")
    wait_until(lambda: mid in rec.ids, what="the message after the restart")
    assert connects.args == [(), ()]  # once per (re)connection, not once per poll
    assert client.stats.polls > 2
    for error, retry_in in errors.args:
        assert isinstance(error, Exception) and isinstance(retry_in, float) and retry_in >= 0
    assert len(errors.args) == client.stats.failures
    assert {t for t in connects.threads | errors.threads if not t.startswith("shmbus.client")} == set()


def test_on_reset_names_the_channel_and_both_ids(server: Target, make_client: MakeClient, channel: str) -> None:
    old = server.publish(channel, "old")
    resets = Calls()
    client = make_client(server.url, on_reset=resets)
    rec = Recorder()
    client.subscribe(channel, rec, 10_000_000)
    rec.wait(1)
    assert resets.args == [(Reset(channel, sent=10_000_000, server=old),)]
    assert rec.ids == [old] and client.stats.resets == 1


def test_on_rate_limited_then_on_connect() -> None:
    def script(seen: Seen, n: int) -> Reply:
        if n == 0:
            return Reply(429, {"Retry-After": "0", "Content-Type": "text/plain"}, [b"slow down"])
        return Reply(pieces=[b'[{"channel":"/__status","data":{"/rl":3},"message_id":0,"global_id":-1}]'])

    limited, connects, errors = Calls(), Calls(), Calls()
    with Stub(script) as stub:
        client = MessageBusClient(
            stub.url, min_poll_interval=0.05, on_rate_limited=limited, on_connect=connects, on_error=errors
        )
        client.core.min_retry_after = 0.05  # the floor (15 s), lowered for the test
        with client:
            client.subscribe("/rl", Recorder())
            wait_until(lambda: client.positions.get("/rl") == 3, what="the answer after the 429")
    assert limited.args == [(0.05,)]
    assert connects.args == [()] and errors.args == []  # a 429 is no failure, and no connection yet
    assert client.stats.rate_limited == 1


def test_a_hook_that_raises_is_logged_and_counted_and_polling_goes_on(
    server: Target, channel: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Both kinds of hook, on the async client: a plain function, and a coroutine function (its own task)."""

    async def failing_reset(reset: Reset) -> None:
        await asyncio.sleep(0)
        raise RuntimeError("this async hook always fails")

    async def main() -> tuple[list[Any], int]:
        got: list[Any] = []
        old = server.publish(channel, "old")
        async with AsyncMessageBusClient(
            server.url, callback_interval=0.3, timeout=10, on_connect=Calls(fail=True), on_reset=failing_reset
        ) as client:
            client.subscribe(channel, got.append, 10_000_000)
            while len(got) < 1:
                await asyncio.sleep(0.02)
            new = server.publish(channel, "new")
            while len(got) < 2 or client.stats.hook_errors < 2:
                await asyncio.sleep(0.02)
            assert [m.message_id for m in got] == [old, new]
            return got, client.stats.hook_errors

    with caplog.at_level(logging.ERROR, "shmbus.client"):
        _, hook_errors = asyncio.run(asyncio.wait_for(main(), 30))
    assert hook_errors == 2
    logged = [r for r in caplog.records if r.name == "shmbus.client" and "hook" in r.getMessage()]
    assert {str(r.exc_info[1]) for r in logged if r.exc_info} == {
        "this hook always fails",
        "this async hook always fails",
    }
