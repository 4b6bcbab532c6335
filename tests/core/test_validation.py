"""Bad arguments get a typed error and change nothing: every option is checked before the first store.

The first version checked some options only when packing them into the segment, after the channel's slot had been
rewritten: ``publish(ch, x, max_backlog_size=1.5)`` raised ``struct.error`` and erased the channel's history.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

import shmbus
from shmbus import Bus


def _state(bus: Bus) -> tuple[Any, ...]:
    return (
        bus.last_id("/v"),
        [(m.message_id, m.data) for m in bus.backlog("/v")],
        [(m.global_id, m.channel, m.data) for m in bus.global_backlog()],
        bus.segment.head(),
        bus.segment.global_id(),
    )


BAD_PUBLISHES: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"max_backlog_size": 1.5}, shmbus.InvalidMessage, "max_backlog_size"),
    ({"max_backlog_size": -(2**64)}, shmbus.InvalidMessage, "max_backlog_size"),
    ({"max_backlog_size": 2**64}, shmbus.InvalidMessage, "max_backlog_size"),
    ({"max_backlog_size": 0}, shmbus.InvalidMessage, "max_backlog_size"),  # used to drop the message silently
    ({"max_backlog_size": -1}, shmbus.InvalidMessage, "max_backlog_size"),
    ({"max_backlog_size": True}, shmbus.InvalidMessage, "max_backlog_size"),
    ({"max_backlog_size": "10"}, shmbus.InvalidMessage, "max_backlog_size"),
    ({"max_backlog_age": "x"}, shmbus.InvalidMessage, "max_backlog_age"),
    ({"max_backlog_age": 0}, shmbus.InvalidMessage, "max_backlog_age"),
    ({"max_backlog_age": -5}, shmbus.InvalidMessage, "max_backlog_age"),
    ({"max_backlog_age": math.inf}, shmbus.InvalidMessage, "max_backlog_age"),
    ({"max_backlog_age": math.nan}, shmbus.InvalidMessage, "max_backlog_age"),
    ({"user_ids": [2**70]}, shmbus.InvalidMessageTarget, "64-bit"),  # used to raise OverflowError
    ({"group_ids": [-(2**63) - 1]}, shmbus.InvalidMessageTarget, "64-bit"),
    ({"user_ids": []}, shmbus.InvalidMessageTarget, "nobody"),
    ({"client_ids": "abc"}, shmbus.InvalidMessageTarget, "list"),
    ({"user_ids": [1.5]}, shmbus.InvalidMessageTarget, "int or str"),
    ({"site_id": ["a"]}, shmbus.InvalidChannel, "site_id"),
]


@pytest.mark.parametrize(
    ("options", "error", "says"),
    BAD_PUBLISHES,
    ids=[f"{next(iter(o))}={next(iter(o.values()))!r}"[:40] for o, _, _ in BAD_PUBLISHES],
)
def test_a_refused_publish_option_leaves_the_bus_unchanged(
    make_bus: Any, options: dict[str, Any], error: type[Exception], says: str
) -> None:
    bus = make_bus()
    for i in range(3):
        bus.publish("/v", i)
    bus.publish("/elsewhere", "x")
    before = _state(bus)
    with pytest.raises(error, match=says):
        bus.publish("/v", "bad", **options)
    assert _state(bus) == before
    assert bus.publish("/v", "next") == 4  # the history is intact and the ids continue
    assert [m.data for m in bus.backlog("/v")] == [0, 1, 2, "next"]


@pytest.mark.parametrize(
    "channel",
    [["/a"], None, 42, b"/bytes", {"c": 1}, "", "/a\x00b", "/x$|$y", "/" + "é" * 81, "chat", "a/b", "/a\nb", "/a\rb"],
)
def test_bad_channels_are_invalid_channel_everywhere(make_bus: Any, channel: Any) -> None:
    bus = make_bus()
    bus.publish("/v", 1)
    before = _state(bus)
    calls = [
        lambda: bus.publish(channel, 1),
        lambda: bus.last_id(channel),
        lambda: bus.last_ids(channel),
        lambda: bus.last_message(channel),
    ]
    if channel is not None:  # backlog(None) is the global backlog
        calls.append(lambda: bus.backlog(channel))
    if channel is not None:
        calls.append(lambda: bus.subscribe(channel, print))
        calls.append(lambda: bus.subscribe(channel, print, pattern="prefix"))
    for call in calls:
        with pytest.raises(shmbus.InvalidChannel):
            call()
    assert _state(bus) == before


def test_a_name_without_a_leading_slash_says_so(make_bus: Any) -> None:
    """``publish("chat", 1)`` was accepted while SSE and WebSocket refused ``chat``: one rule, one clear reason."""
    bus = make_bus()
    with pytest.raises(shmbus.InvalidChannel, match="must start with '/'"):
        bus.publish("chat", 1)
    with pytest.raises(shmbus.InvalidChannel, match="pattern must start with '/'"):
        bus.subscribe("chat/*", print, pattern=True)
    assert bus.publish("/__shmbus_cache/x", 1) == 1  # the bus's own names stay open to the Python API


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"last_id": "3"}, "last_id"),
        ({"last_id": 1.0}, "last_id"),
        ({"upto": "x"}, "upto"),
        ({"limit": -1}, "limit"),
        ({"last_id": -1}, "last_id"),
    ],
)
def test_bad_backlog_arguments_are_typed(make_bus: Any, kwargs: dict[str, Any], says: str) -> None:
    bus = make_bus()
    bus.publish("/v", 1)
    with pytest.raises(shmbus.InvalidArgument, match=says):
        bus.backlog("/v", **kwargs)
    with pytest.raises(shmbus.InvalidArgument, match="last_id"):
        bus.global_backlog("0")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"max_backlog_size": 0}, "max_backlog_size"),
        ({"max_global_backlog_size": 1.5}, "max_global_backlog_size"),
        ({"max_backlog_age": -1}, "max_backlog_age"),
        ({"clear_every": 0}, "clear_every"),
        ({"ring_size": 1000}, "ring_size"),
        ({"max_channels": 3}, "max_channels"),
        ({"lock_timeout": 0}, "lock_timeout"),
        ({"mode": 0o777}, "mode"),
        ({"mode": 0o066}, "mode"),
    ],
)
def test_bad_bus_options_fail_at_construction(bus_name: str, options: dict[str, Any], says: str) -> None:
    with pytest.raises(shmbus.InvalidArgument, match=says):
        Bus(bus_name, create=True, **options)


def test_publish_after_close_raises_bus_closed_instead_of_reattaching(make_bus: Any) -> None:
    bus = make_bus()
    bus.publish("/v", 1)
    bus.close()
    with pytest.raises(shmbus.BusClosed, match="closed"):
        bus.publish("/v", 2)
    with pytest.raises(shmbus.BusClosed):
        bus.last_id("/v")
    bus.on()  # reopening is explicit
    assert bus.publish("/v", 2) == 2


def test_an_engine_cannot_store_invalid_ids(make_bus: Any) -> None:
    bus = make_bus()
    env = shmbus.Envelope("/v", None, b'"x"', b"", 10, 60.0)
    for bad in ({"global_id": 0}, {"message_id": -3}, {"global_id": 2**64}, {"message_id": 1.5}):
        with pytest.raises(shmbus.InvalidMessage):
            bus.store(env, **bad)
    assert bus.last_id("/v") == 0 and bus.segment.global_id() == 0


def test_publish_outcome_unknown_survives_pickling_with_its_fields() -> None:
    """A task queue (Celery) pickles a task's exception to another process: the fields must come along, and a cause
    that cannot be pickled travels as its text instead of failing the pickling."""
    import pickle
    import threading

    class Unpicklable(Exception):
        def __init__(self) -> None:
            super().__init__("held a lock")
            self.lock = threading.Lock()

    for cause, cause_type in ((TimeoutError("read timed out"), TimeoutError), (Unpicklable(), RuntimeError)):
        exc = shmbus.PublishOutcomeUnknown(
            "Redis at r:6379: sent, reply not read", channel="/c", backend="redis", where="r:6379", cause=cause
        )
        back = pickle.loads(pickle.dumps(exc))
        assert isinstance(back, shmbus.PublishOutcomeUnknown) and str(back) == str(exc)
        assert (back.channel, back.backend, back.where, back.sent, back.count) == ("/c", "redis", "r:6379", True, 1)
        assert type(back.cause) is cause_type and str(cause) in str(back.cause)
