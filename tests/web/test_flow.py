"""The sans-IO poll flow driven directly, bytes in and bytes out, as h11's tests drive h11: no server, no framework.

Every shell (WSGI, ASGI, the lean server) runs this same flow; these transcripts pin what it asks of a shell
(the body, then the lookups, in order) and the exact bytes it answers with.
"""

from __future__ import annotations

from typing import Any

import pytest

from shmbus import Bus
from shmbus.adapters.http import MessageBusProtocol, Options, Poll, ProtocolError
from shmbus.adapters.http.flow import READ_BODY, CallLookup, RequestHead, advance, request_flow, run_sync

FORM = "application/x-www-form-urlencoded"
POLL = "/message-bus/abc/poll"


def protocol(bus: Bus, **options: Any) -> MessageBusProtocol:
    return MessageBusProtocol(bus, Options(**options))


def answer(proto: MessageBusProtocol, head: RequestHead, body: bytes = b"", context: Any = None, **kw: Any) -> Poll:
    return run_sync(request_flow(proto, head, **kw), lambda: body, lambda step: step.fn(context, *step.args))


def test_backlog_poll_is_answered_at_once(bus: Bus) -> None:
    bus.publish("/a", {"x": 1})
    poll = answer(protocol(bus), RequestHead("POST", POLL, "dlp=t", FORM), b"/a=0&__seq=1")
    assert poll.mode == "immediate" and poll.response is not None
    assert poll.response.status == 200
    assert ("content-type", "application/json; charset=utf-8") in poll.response.headers
    assert poll.response.body == b'[{"global_id":1,"message_id":1,"channel":"/a","data":{"x":1}}]'


def test_long_poll_parks_then_answers_with_the_live_message(bus: Bus) -> None:
    bus.publish("/a", "old")
    proto = protocol(bus)
    woken: list[Any] = []
    poll = answer(proto, RequestHead("POST", POLL, "", FORM, dont_chunk=True), b"/a=1", waker=woken.append)
    assert poll.mode == "long" and poll.waiter is not None and not woken
    bus.publish("/a", "new")
    proto.dispatch(list(bus.backlog("/a", 1)))  # what the bus listener hands the shell's tap
    assert woken == [poll.waiter]
    assert proto.long_poll_response(poll.waiter) == b'[{"global_id":2,"message_id":2,"channel":"/a","data":"new"}]'


def test_stream_sends_a_first_chunk_then_framed_chunks(bus: Bus) -> None:
    proto = protocol(bus)
    poll = answer(proto, RequestHead("POST", POLL, "", FORM), b"/s=-1", waker=lambda c: None)
    assert poll.mode == "stream" and poll.waiter is not None
    assert poll.first_chunk == b'[{"global_id":-1,"message_id":-1,"channel":"/__status","data":{"/s":0}}]\r\n|\r\n'
    bus.publish("/s", 7)
    proto.dispatch(list(bus.backlog("/s", 0)))
    assert proto.stream_chunks(poll.waiter) == [b'[{"global_id":1,"message_id":1,"channel":"/s","data":7}]\r\n|\r\n']
    assert proto.stream_end(poll.waiter) == [b"[]\r\n|\r\n"]


def test_steps_come_in_order_body_then_each_lookup(bus: Bus) -> None:
    def user(env: Any) -> Any:
        return 7

    def groups(env: Any) -> Any:
        return ["g"]

    def site(env: Any) -> Any:
        return None

    def extra(env: Any) -> Any:
        return {"x-a": "1"}

    proto = protocol(
        bus, user_id_lookup=user, group_ids_lookup=groups, site_id_lookup=site, extra_response_headers_lookup=extra
    )
    bus.publish("/t", "for 7", user_ids=[7])
    bus.publish("/t", "for 8", user_ids=[8])
    flow = request_flow(proto, RequestHead("POST", POLL, "dlp=t", FORM))
    assert advance(flow) is READ_BODY
    steps = [advance(flow, b"/t=0")]
    while not isinstance(steps[-1], Poll):
        step = steps[-1]
        assert isinstance(step, CallLookup)
        steps.append(advance(flow, step.fn(None)))
    assert [s.fn for s in steps[:-1]] == [user, groups, site, extra]  # type: ignore[union-attr]
    poll = steps[-1]
    assert isinstance(poll, Poll) and poll.response is not None
    assert ("x-a", "1") in poll.response.headers
    # the message for user 8 is withheld; the status tells the client the channel's position
    assert poll.response.body == (
        b'[{"global_id":1,"message_id":1,"channel":"/t","data":"for 7"},'
        b'{"global_id":-1,"message_id":-1,"channel":"/__status","data":{"/t":2}}]'
    )


def test_options_preflight_reads_no_body(bus: Bus) -> None:
    flow = request_flow(protocol(bus), RequestHead("OPTIONS", POLL))
    poll = advance(flow)
    assert isinstance(poll, Poll) and poll.response is not None
    assert (poll.response.status, poll.response.body) == (200, b"OK")


def test_a_body_the_shell_refuses_becomes_its_4xx(bus: Bus) -> None:
    flow = request_flow(protocol(bus), RequestHead("POST", POLL, "", FORM))
    assert advance(flow) is READ_BODY
    poll = advance(flow, error=ProtocolError(413, "request body too large (limit 10 bytes)"))
    assert isinstance(poll, Poll) and poll.response is not None
    assert (poll.response.status, poll.response.body) == (413, b"request body too large (limit 10 bytes)")
    assert ("connection", "close") in poll.response.headers


@pytest.mark.parametrize(
    "body, status, reason",
    [
        (b"/a=x", 400, b"invalid id for channel '/a': 'x' is not an integer"),
        (b'{"/a":', 400, b"malformed JSON body"),
    ],
)
def test_bad_polls_get_their_reason(bus: Bus, body: bytes, status: int, reason: bytes) -> None:
    content_type = "application/json" if body.startswith(b"{") else FORM
    poll = answer(protocol(bus), RequestHead("POST", POLL, "", content_type), body)
    assert poll.response is not None and (poll.response.status, poll.response.body) == (status, reason)


def test_on_middleware_error_answers_and_a_failing_handler_falls_back(bus: Bus) -> None:
    def handler(env: Any, exc: BaseException) -> Any:
        return (418, {"content-type": "text/plain"}, f"handled {type(exc).__name__}")

    poll = answer(protocol(bus, on_middleware_error=handler), RequestHead("POST", POLL, "", FORM), b"/a=x")
    assert poll.response is not None and (poll.response.status, poll.response.body) == (418, b"handled ProtocolError")

    def broken(env: Any, exc: BaseException) -> Any:
        raise RuntimeError("handler bug")

    poll = answer(protocol(bus, on_middleware_error=broken), RequestHead("POST", POLL, "", FORM), b"/a=x")
    assert poll.response is not None and poll.response.status == 400  # logged; the request still gets its 4xx


def test_lookup_errors_other_than_protocol_errors_reach_the_shell(bus: Bus) -> None:
    def user(env: Any) -> Any:
        raise KeyError("session store down")

    with pytest.raises(KeyError):
        answer(protocol(bus, user_id_lookup=user), RequestHead("POST", POLL, "dlp=t", FORM), b"/a=0")


def test_extra_headers_with_line_breaks_are_dropped(bus: Bus) -> None:
    proto = protocol(bus, extra_response_headers_lookup=lambda env: {"x-ok": "1", "x-bad": "1\r\nx-injected: 1"})
    poll = answer(proto, RequestHead("POST", POLL, "dlp=t", FORM), b"/a=0")
    assert poll.response is not None
    assert ("x-ok", "1") in poll.response.headers and all(k != "x-bad" for k, _ in poll.response.headers)


def test_head_requests_are_never_held(bus: Bus) -> None:
    poll = answer(protocol(bus), RequestHead("HEAD", POLL, "", FORM), b"/a=0", waker=lambda c: None)
    assert poll.mode == "immediate"
