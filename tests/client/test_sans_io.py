"""The client's sans-IO parts: the chunk parser, the positions of subscriptions against a model server, the
backoff and the pauses (property tests with hypothesis where the inputs are many)."""

from __future__ import annotations

import json
import re
import zlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shmbus.adapters.http.wire import frame_chunk
from shmbus.client.chunks import (
    ESCAPED,
    SEPARATOR,
    AnswerTooLarge,
    ChunkParser,
    ProtocolViolation,
    decode_array,
    is_streamed,
)
from shmbus.client.inflate import Inflater
from shmbus.client.pacing import Backoff, pause_after_poll, retry_after_seconds
from shmbus.client.positions import Tracker

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@given(st.lists(st.lists(json_values, max_size=4), max_size=6), st.data())
@settings(max_examples=200, deadline=None)
def test_chunk_parser_returns_each_array_whatever_the_read_sizes(arrays: list[list[Any]], data: Any) -> None:
    """What the server frames (shmbus.adapters.http.wire.frame_chunk) comes back piece for piece."""
    stream = b"".join(frame_chunk(json.dumps(a).encode()) for a in arrays)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    parser = ChunkParser()
    got: list[bytes] = []
    for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        got += parser.feed(stream[a:b])
    assert [json.loads(p) for p in got] == arrays
    assert parser.pending == 0


def test_the_escaped_separator_is_undone() -> None:
    parser = ChunkParser()
    assert parser.feed(b"a" + ESCAPED + b"b" + SEPARATOR + b"c") == [b"a" + SEPARATOR + b"b"]
    assert parser.pending == 1


def test_content_type_decides_the_parsing() -> None:
    assert not is_streamed("application/json; charset=utf-8")
    assert is_streamed("text/plain; charset=utf-8") and is_streamed(None)
    assert decode_array(b"[]") == []


class ModelServer:
    """A channel's history 1..last, answered as message_bus does (-1: status; -k: the last k-1; ahead: status)."""

    def __init__(self) -> None:
        self.last = 0

    def answer(self, channel: str, sent: int) -> list[dict[str, Any]]:
        if sent == -1 or sent > self.last:
            return [{"channel": "/__status", "data": {channel: self.last}, "message_id": -1, "global_id": -1}]
        start = max(self.last + sent + 1, 0) if sent < -1 else sent
        return [
            {"channel": channel, "data": i, "message_id": i, "global_id": i} for i in range(start + 1, self.last + 1)
        ]


@given(st.lists(st.one_of(st.integers(1, 5), st.sampled_from(["-1", "-2", "-4", "0", "n"])), max_size=12))
@settings(max_examples=300, deadline=None)
def test_each_subscription_gets_its_own_replay_and_no_duplicate(steps: list[Any]) -> None:
    """Subscriptions added between publishes, from -1, -k, 0 or an id already seen: each gets exactly the ids
    after its own start, in order, once; the others are not replayed to."""
    server, tracker = ModelServer(), Tracker()
    firsts: list[int] = []  # the last id before each subscription's first message
    got: list[list[int]] = []

    def poll_until_quiet() -> None:
        for _ in range(10):
            request = tracker.next_request()
            if request is None:
                return
            items = [i for ch, sent in request.body.items() for i in server.answer(ch, sent)]
            for d in tracker.apply(request, items).deliveries:
                if d.message is not None:
                    d.subscription.callback(d.message.message_id)
            if not request.resolving and not items:
                return

    for step in steps:
        if isinstance(step, int):
            server.last += step
        else:
            start = {"-1": -1, "-2": -2, "-4": -4, "0": 0, "n": server.last // 2}[step]
            firsts.append(max({-1: server.last, -2: server.last - 1, -4: server.last - 3}.get(start, start), 0))
            got.append([])
            tracker.add("/c", got[-1].append, start)
        poll_until_quiet()
    assert got == [list(range(first + 1, server.last + 1)) for first in firsts]


def test_a_status_behind_our_position_is_a_reset_to_0() -> None:
    tracker = Tracker()
    sub = tracker.add("/c", None, 10)
    request = tracker.next_request()
    assert request is not None
    applied = tracker.apply(request, [{"channel": "/__status", "data": {"/c": 3}}])
    assert [(r.sent, r.server) for r in applied.resets] == [(10, 3)] and sub.position == 0


def test_another_message_under_our_last_id_after_an_outage_is_a_reset() -> None:
    tracker = Tracker()
    sub = tracker.add("/c", None, 0)
    msg = {"channel": "/c", "message_id": 1, "global_id": 1, "data": "old"}
    tracker.apply(tracker.next_request(), [msg])  # type: ignore[arg-type]
    tracker.distrust()
    request = tracker.next_request()
    assert request is not None and request.body == {"/c": 0}  # one before: the last message is read again
    same = tracker.apply(request, [msg])
    assert not same.resets and same.duplicates == 1 and sub.position == 1
    tracker.distrust()
    other = tracker.apply(tracker.next_request(), [dict(msg, data="new")])  # type: ignore[arg-type]
    assert other.resets and other.resets[0].replaced and sub.position == 0


def test_backoff_doubles_to_the_cap_and_one_success_resets_it() -> None:
    backoff = Backoff(0.1, 1.0, rng=lambda: 0.0)
    assert [round(backoff.failure(), 3) for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    backoff.success()
    assert backoff.failure() == 0.1
    jittered = Backoff(0.1, 1.0, rng=lambda: 1.0)
    assert jittered.failure() == 0.1 * 0.75


def test_retry_after_has_a_floor_and_survives_garbage() -> None:
    assert retry_after_seconds("1") == 15.0 and retry_after_seconds("40") == 40.0
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT") == 15.0 and retry_after_seconds(None) == 15.0
    assert retry_after_seconds("nan") == 15.0 and retry_after_seconds("-5", floor=0) == 0.0


def test_pauses_after_a_poll() -> None:
    common = {"min_poll_interval": 0.1, "callback_interval": 15.0, "background_callback_interval": 60.0}
    assert pause_after_poll(elapsed=25.0, got_data=False, long_polling=True, **common) == 0.0
    assert abs(pause_after_poll(elapsed=0.01, got_data=True, long_polling=True, **common) - 0.09) < 1e-9
    assert pause_after_poll(elapsed=1.0, got_data=False, long_polling=True, empty_in_a_row=99, **common) == 14.0
    assert pause_after_poll(elapsed=1.0, got_data=True, long_polling=False, **common) == 59.0


def test_an_empty_answer_at_once_is_followed_soon_then_ever_less_often() -> None:
    """A server shutting down gracefully ends its held polls at once with nothing: its restart is polled within
    ``min_poll_interval``, not a ``callback_interval`` later; answers at once with nothing in a row double the
    pause up to ``callback_interval`` (a server that never holds a poll is not polled in a loop)."""
    common = {"min_poll_interval": 0.1, "callback_interval": 15.0, "background_callback_interval": 60.0}
    pauses = [
        pause_after_poll(elapsed=0.0, got_data=False, long_polling=True, empty_in_a_row=n, **common)
        for n in range(1, 12)
    ]
    assert pauses[:3] == [0.1, 0.2, 0.4] and pauses[-3:] == [15.0, 15.0, 15.0]
    assert pauses == sorted(pauses)


def test_unsubscribe_takes_a_name_as_it_is_and_a_trailing_star_as_a_prefix() -> None:
    """As the JS client: ``/x/*`` is every channel under ``/x/``; any other name is that channel only, even one
    holding ``[``, ``?`` or a ``*`` that does not end it."""
    tracker = Tracker()
    names = ["/a[1]", "/a1", "/q?", "/qs", "/x/*y", "/x/zy", "/x/", "/x/a/b", "/xa"]
    for name in names:
        tracker.add(name, None, 0)
    assert [s.channel for s in tracker.remove("/a[1]")] == ["/a[1]"]
    assert [s.channel for s in tracker.remove("/q?")] == ["/q?"]
    assert [s.channel for s in tracker.remove("/x/*y")] == ["/x/*y"]
    assert [s.channel for s in tracker.remove("/x/*")] == ["/x/zy", "/x/", "/x/a/b"]
    assert [s.channel for s in tracker.subscriptions] == ["/a1", "/qs", "/xa"]


def test_the_defaults_are_the_issues_and_the_ruby_clients() -> None:
    from shmbus.client import AsyncMessageBusClient, MessageBusClient

    client = AsyncMessageBusClient("http://127.0.0.1:9/forum")
    assert (client.long_polling, client.chunked, client.min_poll_interval, client.max_poll_interval) == (
        True,
        True,
        0.1,
        180.0,
    )
    assert (client.background_callback_interval, client.callback_interval, client.timeout) == (60.0, 15.0, 60.0)
    assert re.fullmatch(r"[0-9a-f]{32}", client.client_id) and client.headers == {}
    assert client.poll_url == f"http://127.0.0.1:9/forum/message-bus/{client.client_id}/poll"
    assert client.status == MessageBusClient("http://127.0.0.1:9").status == "new"


def test_a_piece_over_the_limit_is_refused_as_soon_as_the_buffer_holds_more() -> None:
    parser = ChunkParser(limit=100)
    assert parser.feed(b"[" + b"1," * 40 + b"1]" + SEPARATOR) == [b"[" + b"1," * 40 + b"1]"]  # 83 bytes: fine
    parser.feed(b"[" + b"1," * 45)
    with pytest.raises(AnswerTooLarge):
        parser.feed(b"1,1,1,1,1,1")  # 102 bytes held, no separator yet
    with pytest.raises(AnswerTooLarge):  # a long piece completed in one read
        ChunkParser(limit=100).feed(b"[" + b"1," * 60 + b"1]" + SEPARATOR)


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "raw deflate", "identity"])
def test_inflating_yields_bounded_pieces_of_the_same_bytes(encoding: str) -> None:
    data = b"[0]" + bytes(1 << 21) + b"x" * 1000
    wbits = {"gzip": 31, "deflate": 15, "raw deflate": -15}.get(encoding)
    sent = data if wbits is None else zlib.compress(data, 9, wbits)
    inflater = Inflater(encoding.replace("raw ", ""), piece=4096)
    out = [p for i in range(0, len(sent), 777) for p in inflater.feed(sent[i : i + 777])]
    out += list(inflater.flush())
    assert b"".join(out) == data and max(map(len, out)) <= 4096


def test_an_encoding_not_asked_for_or_a_corrupt_body_is_a_violation() -> None:
    with pytest.raises(ProtocolViolation):
        Inflater("br")
    with pytest.raises(ProtocolViolation):
        Inflater("gzip, gzip")
    with pytest.raises(ProtocolViolation):
        list(Inflater("gzip").feed(b"not gzip at all"))
