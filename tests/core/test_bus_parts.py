"""The parts a Bus owns (shmbus/bus/), each driven alone, without a Bus around it; and what the facade must keep in
step when the parts' inputs change (the publisher's direct path)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import shmbus
from shmbus.bus.attachment import Attachment
from shmbus.bus.engine_table import EngineTable, engine_keys
from shmbus.bus.names import Names
from shmbus.bus.results import Subscription
from shmbus.bus.subscriptions import SubscriptionTable
from shmbus.codecs import get_codec
from shmbus.engine_urls import engine_from_url, register_engine_kind
from shmbus.engines import Engine, Envelope
from shmbus.figures import RELAY_STATES, RelayState
from shmbus.message import Message
from tests.harness.wait import wait_for


class Recorder(Engine):
    """An engine that only records what it is told."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, bool]] = []

    def _note(self, *call: Any) -> bool:
        self.calls.append(call)
        return True

    def subscribe(self, to: str, is_pattern: bool = False) -> bool:
        return self._note("sub", to, is_pattern)

    def unsubscribe(self, from_: str, is_pattern: bool = False) -> bool:
        return self._note("unsub", from_, is_pattern)

    def publish(self, bus: Any, envelope: Envelope) -> int | None:
        self._note("pub", envelope.channel, False)
        return 7


class NoHost:
    """Stands for the bus where a part only passes it on to engines."""

    name = "no-host"


def message(channel: str, global_id: int = 1) -> Message:
    return Message(global_id, global_id, channel, b'"x"', get_codec(None))


def test_the_subscription_table_dispatches_and_counts_for_engines() -> None:
    """Exact, pattern and catch-all subscriptions each get what matches; engines hear of the first holder of a
    channel and of the last one leaving; an owner's new subscription replaces its old one with no flap."""
    engines = EngineTable(NoHost(), None)  # type: ignore[arg-type]
    rec = Recorder()
    engines.attach(rec)
    table = SubscriptionTable(engines)
    got: list[tuple[str, str]] = []
    owner = object()
    table.add(Subscription("/a", lambda m: got.append(("exact", m.channel)), None, None))
    table.add(Subscription("/b/*", lambda m: got.append(("glob", m.channel)), "glob", None))
    table.add(Subscription(None, lambda m: got.append(("all", m.channel)), None, None))
    first = Subscription("/a", lambda m: got.append(("old", m.channel)), None, None, owner)
    table.add(first)
    replaced = table.add(Subscription("/a", lambda m: got.append(("new", m.channel)), None, None, owner))
    assert replaced == [first]
    table.dispatch([message("/a"), message("/b/c", 2)])
    assert got == [("exact", "/a"), ("new", "/a"), ("all", "/a"), ("glob", "/b/c"), ("all", "/b/c")]
    assert engines.subscribed() == {("/a", False): 2, ("/b/*", True): 1, ("*", True): 1}
    assert ("unsub", "/a", False) not in rec.calls  # the owner's replacement was counted in before the old one out
    assert table.remove("/a") == 2 and table.on("/a") == ()
    assert rec.calls[-1] == ("unsub", "/a", False)


def test_a_lingering_tap_applies_only_while_nothing_else_listens() -> None:
    table = SubscriptionTable(EngineTable(NoHost(), None))  # type: ignore[arg-type]
    batches: list[int] = []
    tap = lambda msgs: batches.append(len(msgs))  # noqa: E731
    table.tap(tap, 0.25)
    assert table.linger() == 0.25 and table
    table.dispatch([message("/x"), message("/y", 2)])
    assert batches == [2]
    table.add(Subscription("/x", lambda m: None, None, None))
    assert table.linger() == 0.0
    table.untap(tap)
    assert table.lingering() == {}


def test_engine_keys_say_what_engines_know() -> None:
    assert engine_keys(None, None) == [("*", True)]
    assert engine_keys("/a", None) == [("/a", False)]
    assert engine_keys("/a/*", "glob") == [("/a/*", True)]
    assert engine_keys("/a/", "prefix") == [("/a", False), ("/a/**", True)]


def test_names_cache_keys_and_decode_records_once(bus: shmbus.Bus) -> None:
    names = Names(get_codec(None), lambda: "s1")
    assert names.key("/c", "s1") == b"/c$|$s1"
    assert names.resolve_site("/c", None) == "s1"
    assert names.resolve_site("/global/c", "s2") is None  # global channels have no site
    with pytest.raises(shmbus.InvalidChannel):
        names.channel_key("no-slash")
    bus.publish("/c", {"n": 1})
    rec = bus.segment.read_since(bus.segment.tail())[0][0]
    msg = names.message(rec, 5)
    assert (msg.channel, msg.data, msg.epoch) == ("/c", {"n": 1}, 5)


def test_the_attachment_opens_on_first_use_and_refuses_after_close(bus_name: str) -> None:
    att = Attachment(bus_name, 1 << 20, 64, "json", None, True, 0o600, 5.0)
    attached: list[Any] = []
    att.on_attach.append(attached.append)
    assert att.current is None and att.here() is None
    seg = att.segment
    assert attached == [seg] and att.here() is seg and att.segment is seg
    att.closed = True
    att.detach()
    with pytest.raises(shmbus.BusClosed):
        _ = att.segment
    att.reopen()
    assert att.segment is not seg  # attached again
    att.detach()
    att.destroy()
    with pytest.raises(shmbus.BusDestroyed):
        att.attach()


def test_the_direct_publish_follows_what_it_depends_on(make_bus: Callable[..., shmbus.Bus]) -> None:
    """A plain publish appends straight to the segment only while nothing else applies: a site lookup set later,
    a default engine set later, or a close each take it off that path at once."""
    bus = make_bus()
    assert bus.publish("/d", 1) == 1
    bus.site_id_lookup = lambda: "s9"
    bus.publish("/d", 2)
    assert [m.data for m in bus.backlog("/d", 0, "s9")] == [2]
    bus.site_id_lookup = None
    engine = Recorder()
    bus.default = engine
    assert bus.publish("/d", 3) == 7 and ("pub", "/d", False) in engine.calls
    bus.default = None
    assert bus.publish("/d", 4) == 2
    bus.close()
    with pytest.raises(shmbus.BusClosed):
        bus.publish("/d", 5)


def test_figures_are_the_written_report(make_bus: Callable[..., shmbus.Bus]) -> None:
    bus = make_bus()
    got: list[Message] = []
    bus.subscribe("/f", got.append)
    bus.publish("/f", 1)
    wait_for(lambda: got)
    figures = bus.figures()
    assert figures.listener.listening and figures.listener.position == 1 and figures.listener.lost == 0
    assert figures.relays == [] and figures.relay_lost == 0


def test_engine_kinds_are_registered_not_imported() -> None:
    """engine_from_url builds what a package registered; an unknown scheme is a ValueError."""
    made: list[tuple[str, bool, dict[str, str]]] = []

    def factory(url: str, relay: bool, options: Any) -> Engine:
        made.append((url, relay, dict(options)))
        return Recorder()

    register_engine_kind("test-kind", ("testkind",), factory)
    engine = engine_from_url("testkind://h/1", options={"x": "y"})
    assert isinstance(engine, Recorder) and made == [("testkind://h/1", False, {"x": "y"})]
    with pytest.raises(ValueError, match="no bridge engine"):
        engine_from_url("nosuch://h")


def test_one_relay_state_vocabulary() -> None:
    from typing import get_args

    assert RELAY_STATES[0] == "" and RELAY_STATES[1:] == get_args(RelayState)
