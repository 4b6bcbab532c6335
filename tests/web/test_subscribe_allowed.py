"""``subscribe_allowed`` on the poll protocol (docs/protocol.md, "Subscribe authorisation"), through the sans-IO
flow and both shells (WSGI and ASGI, in-process): a refused channel delivers nothing in any mode — no published
message, no backlog, no last id, no ``/__status`` entry — while the allowed channels of the same poll work as
before, and the refusal is named in the ``shmbus-refused-channels`` header. The lean server: tests/server/
test_subscribe_allowed_server.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shmbus import Bus
from shmbus.adapters.http import REFUSED_HEADER, MessageBusProtocol, Options, RequestInfo
from shmbus.adapters.http.flow import READ_BODY, CallLookup, RequestHead, advance, request_flow
from tests.harness.wait import wait_for

from .rawhttp import split_stream

FORM = "application/x-www-form-urlencoded"
SECRET = "/private/board"


class Gate:
    """A hook refusing every channel under ``/private``, recording each question."""

    def __init__(self) -> None:
        self.asked: list[tuple[RequestInfo, str]] = []

    def __call__(self, info: RequestInfo, channel: str) -> bool:
        self.asked.append((info, channel))
        return not channel.startswith("/private")


def channels_in(body: bytes) -> set[str]:
    """Every channel named anywhere in an answer: as a message's channel or a /__status key."""
    pieces = split_stream(body) if body.endswith(b"\r\n|\r\n") else [body]
    out: set[str] = set()
    for piece in pieces:
        for item in json.loads(piece):
            out.add(item["channel"])
            if item["channel"] == "/__status":
                out.update(item["data"])
    return out


def publish_both(bus: Bus, n: int = 3) -> None:
    for i in range(n):
        bus.publish("/open", f"open {i}")
        bus.publish(SECRET, f"secret {i}")


# ---------------------------------------------------------------------------------------------------- the flow
def test_the_hook_is_asked_once_per_channel_after_the_lookups_with_their_results(bus: Bus) -> None:
    gate = Gate()
    proto = MessageBusProtocol(
        bus,
        Options(
            user_id_lookup=lambda env: 7,
            group_ids_lookup=lambda env: ["staff"],
            site_id_lookup=lambda env: "s1",
            subscribe_allowed=gate,
        ),
    )
    context = {"REQUEST_METHOD": "POST"}
    flow = request_flow(proto, RequestHead("POST", "/message-bus/cid1/poll", "dlp=t", FORM))
    assert advance(flow) is READ_BODY
    step = advance(flow, b"/open=-1&/private/board=-1&/private/x=0&__seq=1")
    names = []
    while isinstance(step, CallLookup):
        names.append(getattr(step.fn, "__name__", ""))
        step = advance(flow, step.fn(context, *step.args))
    assert names[:3] == ["<lambda>"] * 3, "the lookups run before the hook"
    assert names[3:] == ["request_info", "ask", "ask", "ask"]
    assert [ch for _, ch in gate.asked] == ["/open", "/private/board", "/private/x"]
    info = gate.asked[0][0]
    assert info == RequestInfo(context, "cid1", 7, frozenset({"staff"}), "s1")
    assert all(i is info for i, _ in gate.asked), "one RequestInfo per request"
    assert step.response is not None
    assert json.loads(step.response.body) == [
        {"global_id": -1, "message_id": -1, "channel": "/__status", "data": {"/open": 0}}
    ]
    assert (REFUSED_HEADER, "/private/board,/private/x") in step.response.headers


def test_no_hook_asks_nothing_and_answers_as_before(bus: Bus) -> None:
    proto = MessageBusProtocol(bus, Options())
    flow = request_flow(proto, RequestHead("POST", "/message-bus/c/poll", "dlp=t", FORM))
    advance(flow)
    step = advance(flow, b"/private/board=-1")
    assert not isinstance(step, CallLookup)
    assert step.response is not None and b"/private/board" in step.response.body
    assert all(name != REFUSED_HEADER for name, _ in step.response.headers)


def test_refused_names_are_percent_encoded_in_the_header(bus: Bus) -> None:
    proto = MessageBusProtocol(bus, Options(subscribe_allowed=lambda info, ch: False))
    flow = request_flow(proto, RequestHead("POST", "/message-bus/c/poll", "dlp=t", "application/json"))
    advance(flow)
    step = advance(flow, json.dumps({"/a,b": 0, "/é x": 0}).encode())
    while isinstance(step, CallLookup):
        step = advance(flow, step.fn(None, *step.args))
    assert step.response is not None and step.response.body == b"[]"
    assert (REFUSED_HEADER, "/a%2Cb,/%C3%A9%20x") in step.response.headers


# ---------------------------------------------------------------------------------------------------- both shells
def test_backlog_from_zero_and_from_an_old_position(bus: Bus, driver: Any, kind: str) -> None:
    publish_both(bus)
    gate = Gate()
    d = driver(kind, subscribe_allowed=gate)
    r = d.poll("c1", {"/open": 0, SECRET: 0}, dlp=True)
    body = r.body()
    assert [m["data"] for m in json.loads(body)] == ["open 0", "open 1", "open 2"]
    assert channels_in(body) == {"/open"}
    assert r.header(REFUSED_HEADER) == SECRET
    r = d.poll("c1", {"/open": 1, SECRET: 1}, dlp=True)  # an old position on the refused channel
    assert [m["data"] for m in json.loads(r.body())] == ["open 1", "open 2"]
    assert [ch for _, ch in gate.asked] == ["/open", SECRET] * 2, "asked once per channel per request"


def test_last_id_minus_one_gives_no_status_for_the_refused_channel(bus: Bus, driver: Any, kind: str) -> None:
    publish_both(bus)
    d = driver(kind, subscribe_allowed=Gate())
    body = d.poll("c1", {"/open": -1, SECRET: -1}, dlp=True).body()
    assert json.loads(body) == [{"global_id": -1, "message_id": -1, "channel": "/__status", "data": {"/open": 3}}]


@pytest.mark.parametrize("position", [99, -3])
def test_a_position_past_the_end_or_a_look_back_tells_nothing(bus: Bus, driver: Any, kind: str, position: int) -> None:
    """Past the newest id the gem answers a /__status with the channel's id; -k replays the last k-1: neither
    for a refused channel."""
    publish_both(bus)
    d = driver(kind, subscribe_allowed=Gate())
    body = d.poll("c1", {"/open": position, SECRET: position}, dlp=True).body()
    if position > 0:
        assert json.loads(body) == [{"global_id": -1, "message_id": -1, "channel": "/__status", "data": {"/open": 3}}]
    else:
        assert [(m["channel"], m["data"]) for m in json.loads(body)] == [("/open", "open 1"), ("/open", "open 2")]


def test_a_poll_of_refused_channels_only_waits_and_never_loops(bus: Bus, driver: Any, kind: str) -> None:
    """Nothing to answer at once: the poll parks (no tight re-poll loop in any client) and ends with []."""
    publish_both(bus)
    d = driver(kind, subscribe_allowed=Gate(), long_polling_interval=0.5)
    r = d.poll("c1", {SECRET: 0})
    wait_for(lambda: d.parked() == 1, what="parked")
    bus.publish(SECRET, "while parked")
    assert r.body() == b"[]"
    assert r.header(REFUSED_HEADER) == SECRET


def test_long_poll_is_woken_by_the_allowed_channel_only(bus: Bus, driver: Any, kind: str) -> None:
    d = driver(kind, subscribe_allowed=Gate(), long_polling_interval=30)
    r = d.poll("c1", {"/open": 0, SECRET: 0})
    wait_for(lambda: d.parked() == 1, what="parked")
    bus.publish(SECRET, "secret live")
    bus.publish("/open", "open live")
    body = r.body()
    assert json.loads(body) == [{"global_id": 2, "message_id": 1, "channel": "/open", "data": "open live"}]


def test_stream_carries_nothing_of_the_refused_channel(bus: Bus, driver: Any, kind: str) -> None:
    publish_both(bus, 2)
    d = driver(kind, subscribe_allowed=Gate(), long_polling_interval=1.0)
    r = d.poll("c1", {"/open": 0, SECRET: 0}, chunk=True)
    first = r.next_piece()
    assert first is not None and channels_in(first) == {"/open"}
    assert r.header(REFUSED_HEADER) == SECRET
    wait_for(lambda: d.parked() == 1, what="parked")
    bus.publish(SECRET, "secret live")
    bus.publish("/open", "open live")
    body = r.body()
    assert channels_in(body) == {"/open"}
    assert b"secret" not in body
    assert [m["data"] for p in split_stream(body) for m in json.loads(p)][-1:] == ["open live"]


def test_a_hook_that_raises_fails_the_poll(bus: Bus, driver: Any, kind: str) -> None:
    def broken(info: RequestInfo, channel: str) -> bool:
        raise RuntimeError("no session store")

    seen: list[BaseException] = []

    def on_error(env: Any, exc: BaseException) -> Any:
        seen.append(exc)
        return (503, {"content-type": "text/plain"}, b"try later")

    publish_both(bus)
    d = driver(kind, subscribe_allowed=broken, on_middleware_error=on_error)
    r = d.poll("c1", {SECRET: 0}, dlp=True)
    assert (r.status, r.body()) == (503, b"try later")
    assert isinstance(seen[0], RuntimeError)


def test_async_hook_on_asgi_and_never_a_silent_yes_on_wsgi(bus: Bus, driver: Any, kind: str) -> None:
    async def gate(info: RequestInfo, channel: str) -> bool:
        return not channel.startswith("/private")

    publish_both(bus, 1)
    d = driver(kind, subscribe_allowed=gate)
    r = d.poll("c1", {"/open": 0, SECRET: 0}, dlp=True)
    if kind == "asgi":
        assert channels_in(r.body()) == {"/open"}
        return
    with pytest.raises(TypeError, match="awaitable"):  # WSGI cannot await it: an error, never a truthy "allowed"
        r.body()


def test_the_hook_must_be_callable() -> None:
    with pytest.raises(TypeError, match="subscribe_allowed"):
        Options(subscribe_allowed="yes")  # type: ignore[arg-type]


def test_a_reset_while_parked_names_only_the_allowed_channels(bus: Bus, driver: Any, kind: str) -> None:
    """The reset answer (a status of 0 per channel) covers the parked request's channels: the allowed ones."""
    publish_both(bus, 1)
    d = driver(kind, subscribe_allowed=Gate(), long_polling_interval=20)
    r = d.poll("c1", {"/open": 1, SECRET: 1})
    wait_for(lambda: d.parked() == 1, what="parked")
    bus.reset()
    bus.publish(SECRET, "new epoch")
    bus.publish("/open", "new epoch")
    assert json.loads(r.body()) == [{"global_id": -1, "message_id": -1, "channel": "/__status", "data": {"/open": 0}}]
