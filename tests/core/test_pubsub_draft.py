"""The iodine pub/sub draft on the bus: ``pubsub_version``, owner-replaced subscriptions, ``engine=False`` and
engines written to the draft's own interface (:class:`shmbus.PubSubEngine`). docs/transports.md maps each MUST
statement of the draft to its test; the client-object ones are in tests/transports/test_pubsub_clients.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

import shmbus
from shmbus import Bus, Message, PubSubEngine
from shmbus.errors import EngineError, InvalidChannel, InvalidMessage
from tests.harness.wait import wait_for


class DraftRecorder(PubSubEngine):
    """A draft engine that records its calls and, like a broker echoing back, delivers on this host."""

    def __init__(self, bus: Bus | None = None, accept: bool = True, explode: bool = False) -> None:
        self.bus = bus
        self.accept = accept
        self.explode = explode
        self.calls: list[tuple[str, str, bool]] = []
        self.published: list[tuple[str, str]] = []

    def subscribe(self, to: str, is_pattern: bool = False) -> bool:
        self.calls.append(("sub", to, is_pattern))
        if self.explode:
            raise RuntimeError("engine down")
        return True

    def unsubscribe(self, from_: str, is_pattern: bool = False) -> bool:
        self.calls.append(("unsub", from_, is_pattern))
        return True

    def publish(self, channel: str, message: str) -> bool:
        assert isinstance(message, str)
        self.published.append((channel, message))
        if self.accept and self.bus is not None:
            self.bus.publish(channel, message, engine=False)
        return self.accept


def collect(bus: Bus, channel: str, **kw: Any) -> list[Message]:
    got: list[Message] = []
    bus.subscribe(channel, got.append, **kw)
    return got


def test_pubsub_version_is_the_drafts_development_version(make_bus: Any) -> None:
    assert Bus.pubsub_version == 0 and make_bus().pubsub_version == 0


def test_a_subscription_without_callback_on_the_bus_raises(make_bus: Any) -> None:
    bus = make_bus()
    with pytest.raises(TypeError, match="callback"):
        bus.subscribe("/x", None)


def test_patterns_are_supported_and_documented_as_globs(make_bus: Any) -> None:
    bus = make_bus()
    got = collect(bus, "/room/*", pattern=True)
    bus.publish("/room/1", "a")
    bus.publish("/room/1/deep", "no")
    bus.publish("/other", "no")
    wait_for(lambda: len(got) == 1)
    assert [m.data for m in got] == ["a"]


def test_same_owner_same_channel_replaces_without_an_engine_flap(make_bus: Any) -> None:
    bus = make_bus()
    engine = DraftRecorder()
    bus.attach(engine)
    owner = object()
    first: list[Any] = []
    second: list[Any] = []
    bus.subscribe("/r", lambda m: first.append(m.data), owner=owner)
    bus.subscribe("/r", lambda m: second.append(m.data), owner=owner)
    other: list[Any] = []
    bus.subscribe("/r", lambda m: other.append(m.data), owner=object())  # another owner: kept
    bus.publish("/r", 1)
    wait_for(lambda: second and other)
    assert first == [] and second == [1] and other == [1]
    assert engine.calls == [("sub", "/r", False)]  # once per process, never unsubscribed in between
    assert bus.unsubscribe("/r", owner=owner) == 1
    assert engine.calls == [("sub", "/r", False)]  # the other owner still subscribes
    bus.detach(engine)


def test_a_replacing_subscription_gets_the_messages_in_flight(make_bus: Any) -> None:
    """A message appended before an owner's re-subscription but not yet dispatched reaches the new callback (the
    replaced one never gets it). Holding the dispatch lock keeps the listener from dispatching in between."""
    bus = make_bus()
    owner = object()
    first: list[Any] = []
    second: list[Any] = []
    bus.subscribe("/f", lambda m: first.append(m.data), owner=owner)
    with bus.subscriptions.dispatch_lock:
        bus.publish("/f", "in flight")
        bus.subscribe("/f", lambda m: second.append(m.data), owner=owner)
    bus.publish("/f", "after")
    wait_for(lambda: second == ["in flight", "after"])
    assert first == []


def test_subscriptions_close_when_their_owner_is_garbage_collected(make_bus: Any) -> None:
    """The draft: a subscription not bound to a client closes when its pub/sub object is garbage collected. An
    owner is held weakly (so is a callback that is its bound method); once collected its subscriptions are never
    called again and engines hear ``unsubscribe``. An owner without weak references is held as given."""
    import gc

    bus = make_bus()
    engine = DraftRecorder()
    bus.attach(engine)

    class Owner:
        def __init__(self) -> None:
            self.got: list[Any] = []

        def on_message(self, m: Message) -> None:
            self.got.append(m.data)

    owner = Owner()
    got = owner.got
    seen: list[Any] = []
    bus.subscribe("/gc", owner.on_message, owner=owner)
    bus.subscribe("/gc2/*", lambda m: seen.append(m.data), pattern=True, owner=owner)
    plain = object()  # no weak references: kept, never closed by the collector
    kept: list[Any] = []
    bus.subscribe("/gc", lambda m: kept.append(m.data), owner=plain)
    bus.publish("/gc", 1)
    bus.publish("/gc2/x", 2)
    wait_for(lambda: got == [1] and seen == [2] and kept == [1])
    del owner
    gc.collect()
    wait_for(lambda: ("unsub", "/gc2/*", True) in engine.calls)
    bus.publish("/gc", 3)
    bus.publish("/gc2/x", 4)
    wait_for(lambda: kept == [1, 3])
    assert got == [1] and seen == [2]
    assert ("unsub", "/gc", False) not in engine.calls  # the plain owner still subscribes /gc
    assert len(bus.subscriptions.on("/gc")) == 1 and bus.subscriptions.patterns() == ()
    bus.detach(engine)


def test_publish_returns_a_truthy_value_when_scheduled(make_bus: Any) -> None:
    bus = make_bus()
    assert bus.publish("/t", "x")
    assert bus.publish("/t", "x", engine=False) is True
    bus.off()
    assert not bus.publish("/t", "x")  # known not to happen: publishing is off


def test_engine_false_forwards_to_this_process_only(make_bus: Any) -> None:
    bus, peer = make_bus(), make_bus()
    here, there = collect(bus, "/local"), collect(peer, "/local")
    assert bus.publish("/local", "only here", engine=False) is True
    assert [m.data for m in here] == ["only here"]
    peer.publish("/local", "stored")
    wait_for(lambda: len(there) == 1 and len(here) == 2)
    assert [m.data for m in there] == ["stored"] and bus.last_id("/local") == 1


def test_draft_engine_as_default_gets_a_string_after_bookkeeping(make_bus: Any) -> None:
    bus = make_bus()
    engine = DraftRecorder(bus)
    bus.default = engine
    assert bus.default is engine  # the getter returns the object given, not an adapter
    got = collect(bus, "/d")
    assert bus.publish("/d", "text") is True
    assert bus.publish("/d", {"n": 1, "s": "é"}) is True
    assert engine.published == [("/d", "text"), ("/d", '{"n":1,"s":"é"}')]  # non-strings become JSON
    assert [m.data for m in got] == ["text", '{"n":1,"s":"é"}']
    # bookkeeping first: bad input never reaches the engine
    with pytest.raises(InvalidChannel):
        bus.publish("", "x")
    with pytest.raises(TypeError):
        bus.publish("/d", object())
    with pytest.raises(InvalidMessage, match="targeting"):
        bus.publish("/d", "x", user_ids=[1])
    assert len(engine.published) == 2
    bus.default = None
    assert isinstance(bus.default, shmbus.SharedMemoryEngine)


def test_a_changed_encoding_is_valid_and_other_non_strings_raise(make_bus: Any) -> None:
    """The draft: a non-String message MAY become JSON, otherwise publish MUST raise; a changed encoding MUST be
    valid. What an engine receives is strict UTF-8-encodable JSON text; data that cannot become valid JSON (a
    lone surrogate, bytes under the JSON codec, an arbitrary object) raises TypeError and reaches no engine."""
    bus = make_bus()
    engine = DraftRecorder(bus)
    bus.default = engine
    assert bus.publish("/enc", {"f": float("nan"), "s": "é\u2028"}) is True
    ((_channel, text),) = engine.published
    text.encode("utf-8")  # strict: a valid encoding
    assert json.loads(text) == {"f": None, "s": "é\u2028"}  # a non-finite float became null: still valid JSON
    bad_values: list[Any] = ["\ud800", {"k": "\udfff"}, b"\xff", object()]
    for bad in bad_values:
        with pytest.raises(TypeError):
            bus.publish("/enc", bad)
    assert len(engine.published) == 1
    bus.default = None
    for bad in bad_values:  # the bus's own engine: the same rules, nothing stored
        with pytest.raises(TypeError):
            bus.publish("/enc2", bad)
    assert bus.last_id("/enc2") == 0


def test_draft_engine_refusal_is_a_typed_error(make_bus: Any) -> None:
    bus = make_bus()
    with pytest.raises(EngineError, match="refused"):
        bus.publish("/n", "x", engine=DraftRecorder(accept=False))


def test_attach_informs_existing_and_future_subscriptions_once_per_channel(make_bus: Any) -> None:
    bus = make_bus()
    collect(bus, "/a")
    collect(bus, "/a")  # a second subscriber to the same channel: no second engine call
    collect(bus, "/p/*", pattern=True)
    one, two = DraftRecorder(), DraftRecorder()
    bus.attach(one)
    bus.attach(two)  # several engines may be attached
    assert sorted(one.calls) == sorted(two.calls) == [("sub", "/a", False), ("sub", "/p/*", True)]
    collect(bus, "/b")
    assert one.calls[-1] == two.calls[-1] == ("sub", "/b", False)
    bus.detach(two)
    collect(bus, "/c")
    assert ("sub", "/c", False) in one.calls and ("sub", "/c", False) not in two.calls
    bus.unsubscribe("/b")
    assert one.calls[-1] == ("unsub", "/b", False)
    n = len(one.calls)
    bus.reset_engine(one)  # the draft's reset: as if newly attached
    assert sorted(one.calls[n:]) == [("sub", "/a", False), ("sub", "/c", False), ("sub", "/p/*", True)]
    bus.detach(one)


def test_an_engine_that_raises_in_subscribe_is_contained(make_bus: Any, caplog: Any) -> None:
    bus = make_bus()
    bus.attach(DraftRecorder(explode=True))
    got = collect(bus, "/still")  # must not raise
    bus.publish("/still", 1)
    wait_for(lambda: len(got) == 1)


def test_publish_through_an_explicit_draft_engine(make_bus: Any) -> None:
    bus = make_bus()
    engine = DraftRecorder(bus)
    got = collect(bus, "/e")
    assert bus.publish("/e", "via", engine=engine) is True
    assert engine.published == [("/e", "via")] and [m.data for m in got] == ["via"]
    assert bus.last_id("/e") == 0  # the default (shared memory) was not used


def test_a_draft_engine_cannot_carry_a_site(make_bus: Any) -> None:
    bus = make_bus()
    with pytest.raises(InvalidMessage, match="site"):
        bus.publish("/s", "x", site_id="s1", engine=DraftRecorder(bus))


def test_not_an_engine_is_a_type_error(make_bus: Any) -> None:
    bus = make_bus()
    with pytest.raises(TypeError, match="PubSubEngine"):
        bus.attach(object())  # type: ignore[arg-type]
