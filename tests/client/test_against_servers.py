"""The client against real servers: shmbus under gunicorn (lean worker, UvicornWorker, gthread) and the gem's own
server under puma (skipped loudly without the gem). One server of each kind serves the whole module; every test
uses channels of its own."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from shmbus.client import MessageBusClient

from .recorder import Recorder, resolved, wait_until
from .servers import Target

pytestmark = pytest.mark.slow
MakeClient = Callable[..., MessageBusClient]
MODES = {
    "chunked": {},
    "dont-chunk": {"chunked": False},
    "polling": {"long_polling": False, "background_callback_interval": 0.2},
}


def test_from_now_status_then_live_ids(target: Target, make_client: MakeClient, channel: str) -> None:
    early = [target.publish(channel, i) for i in range(2)]
    client = make_client(target.url)
    rec = Recorder()
    client.subscribe(channel, rec)
    assert resolved(client, channel) == early[-1]  # the /__status answer: "now" is the last id
    live = [target.publish(channel, {"n": i}) for i in range(3)]
    got = rec.wait(3)
    time.sleep(0.3)
    assert [m.message_id for m in got] == live and len(rec.messages) == 3
    assert [m.data for m in got] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert [m.global_id for m in got] == [target.global_id(channel, i) for i in live]
    assert {m.channel for m in got} == {channel}


@pytest.mark.parametrize("start", [0, "n", -2])
def test_backlog_from_0_n_and_the_last_one(
    target: Target, make_client: MakeClient, channel: str, start: int | str
) -> None:
    ids = [target.publish(channel, f"m{i}") for i in range(4)]
    last_id = ids[1] if start == "n" else int(start)
    expected = {0: ids, "n": ids[2:], -2: ids[-1:]}[start]
    client = make_client(target.url)
    rec = Recorder()
    client.subscribe(channel, rec, last_id)
    rec.wait(len(expected))
    more = target.publish(channel, "live")
    rec.wait(len(expected) + 1)
    time.sleep(0.3)
    assert rec.ids == [*expected, more]


def test_a_position_ahead_of_the_server_is_reset_and_reported(
    target: Target, make_client: MakeClient, channel: str
) -> None:
    """The server's ids are all behind ours (it restarted empty, the bus is new): they are all new to us."""
    old = target.publish(channel, "old")
    client = make_client(target.url)
    rec = Recorder()
    client.subscribe(channel, rec, 10_000_000)
    wait_until(lambda: client.stats.resets == 1, what="the reset to be reported")
    rec.wait(1)
    fresh = target.publish(channel, "fresh")
    rec.wait(2)
    time.sleep(0.3)
    assert rec.ids == [old, fresh] and client.stats.resets == 1


def test_targeted_messages_reach_only_their_clients(target: Target, make_client: MakeClient, channel: str) -> None:
    user5 = make_client(target.url, headers={"X-User-Id": "5"})
    group7 = make_client(target.url, headers={"X-User-Id": "6", "X-Group-Ids": "7,8"})
    cid = make_client(target.url, client_id="cid-" + channel[2:])
    nobody = make_client(target.url)
    recs = {c: Recorder() for c in (user5, group7, cid, nobody)}
    for c, rec in recs.items():
        c.subscribe(channel, rec)
        resolved(c, channel)
    target.publish(channel, "for user 5", user_ids=[5])
    target.publish(channel, "for group 7", group_ids=[7])
    target.publish(channel, "for the client id", client_ids=[cid.client_id])
    target.publish(channel, "everyone")
    for rec in recs.values():
        wait_until(lambda rec=rec: rec.data and rec.data[-1] == "everyone", what="the public message")  # type: ignore[misc]
    assert recs[user5].data == ["for user 5", "everyone"]
    assert recs[group7].data == ["for group 7", "everyone"]
    assert recs[cid].data == ["for the client id", "everyone"]
    assert recs[nobody].data == ["everyone"]


@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_mode_with_a_100_kb_message(target: Target, make_client: MakeClient, channel: str, mode: str) -> None:
    client = make_client(target.url, **MODES[mode])
    rec = Recorder()
    client.subscribe(channel, rec)
    resolved(client, channel)
    big = {"blob": "x" * 100_000, "tail": "\r\n|\r\n"}
    ids = [target.publish(channel, "small"), target.publish(channel, big), target.publish(channel, "after")]
    rec.wait(3)
    time.sleep(0.3)
    assert rec.ids == ids and rec.data == ["small", big, "after"]
    assert client.stats.failures == 0


def test_subscribe_during_a_poll_is_sent_at_once(target: Target, make_client: MakeClient, channel: str) -> None:
    client = make_client(target.url)
    client.subscribe(channel + "/other", Recorder())
    wait_until(lambda: client.stats.polls >= 1, what="a poll in flight")
    time.sleep(0.2)
    rec = Recorder()
    client.subscribe(channel, rec)  # from now: its status must come back before the publish below
    time.sleep(0.3)
    mid = target.publish(channel, "soon after")
    rec.wait(1)
    assert rec.ids == [mid]


def test_a_second_callback_at_0_replays_to_itself_only(target: Target, make_client: MakeClient, channel: str) -> None:
    ids = [target.publish(channel, i) for i in range(3)]
    client = make_client(target.url)
    first, second = Recorder(), Recorder()
    client.subscribe(channel, first, 0)
    first.wait(3)
    ids.append(target.publish(channel, 3))
    first.wait(4)
    client.subscribe(channel, second, 0)
    second.wait(4)
    ids.append(target.publish(channel, 4))
    first.wait(5)
    second.wait(5)
    time.sleep(0.3)
    assert first.ids == ids and second.ids == ids


def test_unsubscribe_one_callback_or_a_glob(target: Target, make_client: MakeClient, channel: str) -> None:
    client = make_client(target.url)
    a, b, c = Recorder(), Recorder(), Recorder()
    subs = [client.subscribe(channel, a), client.subscribe(channel, b)]
    client.subscribe(channel + "/sub", c)
    resolved(client, channel, subs=subs)
    resolved(client, channel + "/sub")
    assert client.unsubscribe(channel, a) is True
    assert client.unsubscribe(channel, a) is False
    mid = target.publish(channel, "after")
    b.wait(1)
    assert client.unsubscribe(channel + "/*") is True  # the glob removes /sub only
    target.publish(channel + "/sub", "gone")
    last = target.publish(channel, "last")
    b.wait(2)
    time.sleep(0.3)
    assert a.messages == [] and c.messages == [] and b.ids == [mid, last]


def test_a_callback_that_raises_does_not_stop_the_others(
    target: Target, make_client: MakeClient, channel: str, caplog: pytest.LogCaptureFixture
) -> None:
    client = make_client(target.url)
    bad, good = Recorder(fail=True), Recorder()
    subs = [client.subscribe(channel, bad), client.subscribe(channel, good)]
    resolved(client, channel, subs=subs)
    ids = [target.publish(channel, i) for i in range(2)]
    good.wait(2)
    bad.wait(2)
    assert good.ids == ids == bad.ids
    assert client.stats.callback_errors == 2
    logged = [r for r in caplog.records if r.name == "shmbus.client" and "always fails" in str(r.exc_info)]
    assert len(logged) == 2, caplog.records  # each failure logged, with its traceback


def test_stop_returns_at_once_and_nothing_runs_after_it(target: Target, channel: str) -> None:
    client = MessageBusClient(target.url, callback_interval=0.3, timeout=10)
    rec = Recorder()
    client.start()
    client.subscribe(channel, rec)
    resolved(client, channel)
    time.sleep(0.3)  # a long poll is parked now
    t0 = time.monotonic()
    client.stop(timeout=30)
    took = time.monotonic() - t0
    target.publish(channel, "after stop")
    time.sleep(1.5)
    # not a speed claim: a stop that waited for the parked poll would take its 10 s timeout; one that cancels it
    # takes a fraction of a second
    assert took < 5.0, took
    assert rec.messages == [] and client.status == "stopped"
    assert not [t for t in threading.enumerate() if t.name.startswith("shmbus.client")]


def test_pause_keeps_messages_and_listen_iterates(target: Target, make_client: MakeClient, channel: str) -> None:
    client = make_client(target.url)
    rec = Recorder()
    client.subscribe(channel, rec)
    resolved(client, channel)
    client.pause()
    assert client.status == "paused"
    ids = [target.publish(channel, i) for i in range(2)]
    time.sleep(1.0)
    assert rec.messages == []
    client.resume()
    rec.wait(2)
    assert rec.ids == ids
    got: list[Any] = []
    for msg in client.listen(channel, last_id=0, timeout=10):
        got.append(msg.message_id)
        if len(got) == 2:
            break
    assert got == ids
    assert client.positions == {channel: ids[-1]}  # the listener's subscription ended with the loop


def test_the_async_client_with_async_callbacks_and_async_for(target: Target, channel: str) -> None:
    import asyncio

    from shmbus.client import AsyncMessageBusClient

    async def main() -> tuple[list[int], list[int], list[str]]:
        ids = [target.publish(channel, i) for i in range(3)]
        seen: list[int] = []
        order: list[str] = []

        async def slow(msg: Any) -> None:  # awaited before the next message: callbacks never overlap
            order.append(f"start {msg.message_id}")
            await asyncio.sleep(0.05)
            order.append(f"end {msg.message_id}")
            seen.append(msg.message_id)

        async with AsyncMessageBusClient(target.url, callback_interval=0.3) as client:
            client.subscribe(channel, slow, 0)
            got: list[int] = []
            async for msg in client.listen(channel, last_id=0):
                got.append(msg.message_id)
                if len(got) == 3:
                    break
            while len(seen) < 3:
                await asyncio.sleep(0.02)
        assert client.status == "stopped"
        return ids, got, order

    ids, got, order = asyncio.run(main())
    assert got == ids
    assert order == [f"{what} {i}" for i in ids for what in ("start", "end")]


def test_stop_then_start_polls_once_and_goes_on_from_its_positions(target: Target, channel: str) -> None:
    client = MessageBusClient(target.url, callback_interval=0.3, timeout=10)
    rec = Recorder()
    client.subscribe(channel, rec)
    with client:
        resolved(client, channel)
        first = target.publish(channel, "one")
        rec.wait(1)
    missed = target.publish(channel, "while stopped")
    with client:
        threads = [t for t in threading.enumerate() if t.name.startswith("shmbus.client")]
        assert len(threads) == 1, threads
        rec.wait(2)
        last = target.publish(channel, "two")
        rec.wait(3)
        time.sleep(0.3)
    assert rec.ids == [first, missed, last]


def test_an_injected_httpx_client_carries_who_is_asking(target: Target, make_client: MakeClient, channel: str) -> None:
    import httpx

    http = httpx.AsyncClient(headers={"X-User-Id": "42"}, timeout=10)
    client = make_client(target.url, http_client=http)
    rec = Recorder()
    client.subscribe(channel, rec)
    resolved(client, channel)
    mine = target.publish(channel, "for 42", user_ids=[42])
    target.publish(channel, "for 43", user_ids=[43])
    last = target.publish(channel, "all")
    rec.wait(2)
    time.sleep(0.3)
    assert rec.ids == [mine, last]
    client.stop()
    assert not http.is_closed  # the caller's client: the caller closes it
