"""``subscribe_allowed`` on the lean server, in-process (tests/server/rig.py): a plain hook runs on the native
path, an ``async`` one sends the bus routes through the ASGI bridge; either way a refused channel delivers
nothing (backlog, ``/__status``, live, presence) and the allowed one works. The shells' own tests:
tests/web/test_subscribe_allowed.py."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from shmbus import Bus
from shmbus.adapters.asgi import MessageBusMiddleware
from shmbus.adapters.http import REFUSED_HEADER, RequestInfo

from .rig import LONG_POLL, EchoApp, delivered, in_loop, make_rig
from .wire import poll

SECRET = "/private/board"


def plain_gate(info: RequestInfo, channel: str) -> bool:
    return not channel.startswith("/private")


async def async_gate(info: RequestInfo, channel: str) -> bool:
    return not channel.startswith("/private")


@pytest.fixture(params=["native", "bridge"])
def gated_mw(request: pytest.FixtureRequest, shared_bus: Bus) -> Iterator[MessageBusMiddleware]:
    gate: Callable[..., Any] = plain_gate if request.param == "native" else async_gate
    m = MessageBusMiddleware(EchoApp(), bus=shared_bus, long_polling_interval=LONG_POLL, subscribe_allowed=gate)
    try:
        yield m
    finally:
        m.close()


def channels_in(items: list[dict[str, Any]]) -> set[str]:
    out = {m["channel"] for m in items}
    for m in items:
        if m["channel"] == "/__status":
            out |= set(m["data"])
    return out


@in_loop
async def test_backlog_and_status_leave_the_refused_channel_out(
    gated_mw: MessageBusMiddleware, shared_bus: Bus
) -> None:
    for i in range(2):
        shared_bus.publish("/open", i)
        shared_bus.publish(SECRET, i)
    r = make_rig(gated_mw)
    assert r.srv.native is (gated_mw.options.subscribe_allowed is plain_gate)
    r.send(poll("c1", {"/open": 0, SECRET: 0}, dlp=True) + poll("c1", {"/open": -1, SECRET: -1}, dlp=True, seq=2))
    await delivered(lambda: bytes(r.t.out).count(b"HTTP/1.1 200") == 2)
    first, second = r.answers()
    assert [m["data"] for m in json.loads(first.body)] == [0, 1]
    assert channels_in(json.loads(first.body)) == {"/open"}
    assert first.headers[REFUSED_HEADER] == SECRET
    assert json.loads(second.body) == [
        {"global_id": -1, "message_id": -1, "channel": "/__status", "data": {"/open": 2}}
    ]


@in_loop
async def test_a_parked_poll_hears_only_the_allowed_channel(gated_mw: MessageBusMiddleware, shared_bus: Bus) -> None:
    r = make_rig(gated_mw)
    r.send(poll("c1", {"/open": shared_bus.last_id("/open"), SECRET: shared_bus.last_id(SECRET)}))
    await delivered(lambda: gated_mw.protocol().registry.parked == 1)
    shared_bus.publish(SECRET, "secret live")
    shared_bus.publish("/open", "open live")
    await delivered(lambda: bool(r.t.out))
    [got] = r.answers()
    assert [(m["channel"], m["data"]) for m in json.loads(got.body)] == [("/open", "open live")]


@in_loop
async def test_presence_lists_the_poller_on_the_allowed_channel_only(shared_bus: Bus) -> None:
    """Presence (docs/presence.md) on both lean-server paths: the native flow and the ASGI bridge (async hook)."""
    assert shared_bus.presence("/open") == []  # the view is ready (its first call waits one heartbeat)
    for gate in (plain_gate, async_gate):
        m = MessageBusMiddleware(EchoApp(), bus=shared_bus, subscribe_allowed=gate, presence=True)
        try:
            r = make_rig(m)
            cid = gate.__name__.replace("_", "-")
            r.send(poll(cid, {"/open": -1, SECRET: -1}, dlp=True))
            await delivered(lambda r=r: b"HTTP/1.1 200" in bytes(r.t.out))
            await delivered(lambda c=cid: c in [p.client_id for p in shared_bus.presence("/open")])
            assert shared_bus.presence(SECRET) == []
        finally:
            m.close()
