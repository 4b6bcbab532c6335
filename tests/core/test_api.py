"""The Bus API against message_bus semantics (one process; cross-process tests live in test_processes.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest

import shmbus
from shmbus import Bus, Message
from tests.harness.wait import wait_for


def collect(bus: Bus, channel: str | None, last_id: int | None = None, **kw: Any) -> list[Message]:
    got: list[Message] = []
    bus.subscribe(channel, got.append, last_id, **kw)
    return got


def test_ids_follow_the_gem(bus: Bus) -> None:
    assert bus.last_id("/foo") == 0
    assert bus.publish("/foo", "a") == 1
    assert bus.publish("/hello", "b") == 1
    assert bus.publish("/foo", "c") == 2
    assert bus.last_id("/foo") == 2
    assert bus.last_ids("/foo", "/hello", "/nope") == {"/foo": 2, "/hello": 1, "/nope": 0}
    glob = [(m.global_id, m.message_id, m.channel) for m in bus.global_backlog()]
    assert glob == [(1, 1, "/foo"), (2, 1, "/hello"), (3, 2, "/foo")]
    assert [m.data for m in bus.backlog("/foo")] == ["a", "c"]
    assert [m.data for m in bus.backlog("/foo", 1)] == ["c"]
    assert bus.backlog("/foo", 2) == []
    assert bus.last_message("/foo").data == "c"  # type: ignore[union-attr]
    assert bus.last_message("/empty") is None


def test_data_round_trips_with_targets_and_site(bus: Bus) -> None:
    data = {"text": "שלום", "n": [1, 2.5, None, True], "nested": {"k": "v"}}
    bus.publish("/t", data, client_ids=["c1", "c2"], user_ids=[1, "u2"], group_ids=[7], site_id="s1")
    (m,) = bus.backlog("/t", 0, "s1")
    assert m.data == data
    assert m.client_ids == ["c1", "c2"] and m.user_ids == [1, "u2"] and m.group_ids == [7]
    assert m.site_id == "s1" and m.channel == "/t" and m.targeted
    assert m.epoch == bus.epoch
    assert bus.backlog("/t") == []  # another site (none) sees nothing
    assert bus.last_id("/t", "s1") == 1 and bus.last_id("/t") == 0


def test_subscribe_new_only_whole_backlog_and_look_back(bus: Bus) -> None:
    for i in range(1, 4):
        bus.publish("/s", i)
    new_only = collect(bus, "/s")
    whole = collect(bus, "/s", 0)
    after_two = collect(bus, "/s", 2)
    last_one = collect(bus, "/s", -2)
    last_two = collect(bus, "/s", -3)
    up_to_date = collect(bus, "/s", 3)  # the gem re-delivers the whole backlog here (its quirk #13): we don't
    bus.publish("/s", 4)
    wait_for(lambda: len(new_only) == 1 and len(up_to_date) == 1, what="live delivery")
    time.sleep(0.05)
    assert [m.data for m in new_only] == [4]
    assert [m.data for m in whole] == [1, 2, 3, 4]
    assert [m.data for m in after_two] == [3, 4]
    assert [m.data for m in last_one] == [3, 4]
    assert [m.data for m in last_two] == [2, 3, 4]
    assert [m.data for m in up_to_date] == [4]


def test_replay_then_live_has_no_gap_or_duplicate_under_concurrent_publishing(make_bus: Any) -> None:
    bus, other = make_bus(), make_bus()
    import threading

    stop = threading.Event()

    def pump() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            other.publish("/race", i)

    t = threading.Thread(target=pump)
    t.start()
    try:
        time.sleep(0.02)
        got = collect(bus, "/race", 0)
        time.sleep(0.05)
    finally:
        stop.set()
        t.join()
    last = other.last_id("/race")
    wait_for(lambda: got and got[-1].message_id == last, what="catch up")
    ids = [m.message_id for m in got]
    assert ids == list(range(ids[0], last + 1))


def test_unsubscribe_and_catch_all(bus: Bus) -> None:
    got: list[Message] = []
    everything: list[Message] = []
    sub = bus.subscribe("/u", got.append)
    bus.subscribe(None, everything.append)
    bus.publish("/u", 1)
    bus.publish("/other", 2)
    wait_for(lambda: len(everything) == 2)
    assert bus.unsubscribe("/u", sub) == 1
    bus.publish("/u", 3)
    wait_for(lambda: len(everything) == 3)
    assert [m.data for m in got] == [1]
    assert bus.unsubscribe("/never") == 0


def test_callback_errors_are_logged_and_others_still_run(bus: Bus, caplog: pytest.LogCaptureFixture) -> None:
    got: list[Any] = []

    def boom(msg: Message) -> None:
        raise RuntimeError("boom")

    bus.subscribe("/e", boom)
    bus.subscribe("/e", lambda m: got.append(m.data))
    bus.publish("/e", 1)
    bus.publish("/e", 2)
    wait_for(lambda: got == [1, 2])
    assert "failed to deliver message" in caplog.text


def test_patterns_glob_and_prefix(bus: Bus) -> None:
    one = collect(bus, "/chat/*", pattern=True)
    deep = collect(bus, "/chat/**", pattern="glob")
    prefix = collect(bus, "/chat", pattern="prefix")
    for ch in ("/chat/1", "/chat/1/typing", "/chat", "/chatter", "/other/chat/1"):
        bus.publish(ch, ch)
    wait_for(lambda: len(deep) == 2 and len(prefix) == 3)
    time.sleep(0.05)
    assert [m.channel for m in one] == ["/chat/1"]
    assert [m.channel for m in deep] == ["/chat/1", "/chat/1/typing"]
    assert [m.channel for m in prefix] == ["/chat/1", "/chat/1/typing", "/chat"]
    replayed = collect(bus, "/chat/*", 0, pattern=True)
    assert [m.channel for m in replayed] == ["/chat/1"]


@pytest.mark.parametrize("bad", ["/a[]", "/a[!]", "/a[^]", "/a[z-a]", "/a/[b-a]/*"])
def test_a_malformed_glob_is_a_typed_error_and_registers_nothing(bus: Bus, bad: str) -> None:
    """An empty set or a reversed range raises InvalidChannel (a ValueError), never ``re.error``."""
    from shmbus.patterns import compile_pattern

    with pytest.raises(shmbus.InvalidChannel, match="invalid glob"):
        compile_pattern(bad, "glob")
    with pytest.raises(shmbus.InvalidChannel, match="invalid glob"):
        bus.subscribe(bad, lambda m: None, pattern=True)
    assert bus.subscriptions.patterns() == () and bus.engines.subscribed() == {}
    with pytest.raises(shmbus.InvalidArgument, match="unknown pattern kind"):
        compile_pattern("/a", "regex")
    # sets that are well formed keep working, their characters literal (no regex syntax leaks through)
    assert compile_pattern("/a[!b]", "glob")("/ac") and not compile_pattern("/a[!b]", "glob")("/ab")
    assert compile_pattern("/a[&&|]", "glob")("/a|") and compile_pattern("/x[a-c-]", "glob")("/x-")


def test_sites_and_global_channels(make_bus: Any) -> None:
    site = {"v": "a"}
    bus = make_bus(site_id_lookup=lambda: site["v"])
    everything = collect(bus, "/foo")
    local = []
    bus.local_subscribe("/foo", local.append)
    bus.publish("/foo", "for-a")
    bus.publish("/foo", "for-b", site_id="b")
    bus.publish("/global/foo", "everyone")
    assert bus.last_id("/foo") == 1 and bus.last_id("/foo", "b") == 1
    site["v"] = "b"
    assert [m.data for m in bus.backlog("/foo")] == ["for-b"]
    assert [m.data for m in bus.backlog("/global/foo")] == ["everyone"]
    site["v"] = "c"
    assert bus.backlog("/foo") == [] and [m.site_id for m in bus.backlog("/global/foo")] == [None]
    wait_for(lambda: len(everything) == 2 and len(local) == 1)
    assert sorted(m.site_id or "" for m in everything) == ["a", "b"]
    assert [m.data for m in local] == ["for-a"]


def test_invalid_publishes_raise_typed_errors_and_write_nothing(bus: Bus) -> None:
    bus.publish("/ok", 1)
    before = bus.segment.global_id()
    bad: list[tuple[Any, dict[str, Any], type[Exception]]] = [
        (("/global/x", 1), {"user_ids": [1]}, shmbus.InvalidMessage),
        (("/global/x", 1), {"group_ids": [1]}, shmbus.InvalidMessage),
        (("/x", 1), {"user_ids": []}, shmbus.InvalidMessageTarget),
        (("/x", 1), {"client_ids": []}, shmbus.InvalidMessageTarget),
        (("/x", 1), {"group_ids": "12"}, shmbus.InvalidMessageTarget),
        (("/x", 1), {"user_ids": [1.5]}, shmbus.InvalidMessageTarget),
        ((None, 1), {}, shmbus.InvalidChannel),
        ((b"/bytes", 1), {}, shmbus.InvalidChannel),
        (("", 1), {}, shmbus.InvalidChannel),
        (("/nul\x00", 1), {}, shmbus.InvalidChannel),
        (("/" + "x" * 200, 1), {}, shmbus.InvalidChannel),
        (("/a$|$b", 1), {}, shmbus.InvalidChannel),
        (("/x", 1), {"site_id": "s" * 40}, shmbus.InvalidChannel),
        (("/x", {1: object()}), {}, TypeError),
        (("/x", {"set": {1, 2}}), {}, TypeError),
        (("/x", "y" * (1 << 19)), {}, shmbus.PayloadTooLarge),
    ]
    for args, kw, exc in bad:
        with pytest.raises(exc):
            bus.publish(*args, **kw)
    with pytest.raises(TypeError, match="/x"):
        bus.publish("/x", {"k": object()})
    assert bus.segment.global_id() == before
    assert bus.last_id("/x") == 0
    assert [m.data for m in bus.backlog("/ok")] == [1]
    assert bus.publish("/x", 2) == 1  # the bus is fine afterwards


def test_global_user_ids_forbidden_but_client_ids_allowed(bus: Bus) -> None:
    assert bus.publish("/global/c", 1, client_ids=["abc"]) == 1


def test_msgpack_codec_round_trips_bytes(make_bus: Any) -> None:
    bus = make_bus(codec="msgpack")
    bus.publish("/bin", {"blob": b"\x00\xff", "n": 1})
    assert bus.backlog("/bin")[0].data == {"blob": b"\x00\xff", "n": 1}
    with pytest.raises(ValueError, match="codec"):
        make_bus(codec="json").publish("/bin", 1)  # same segment, other codec: refused


def test_custom_codec_interface(make_bus: Any) -> None:
    class Upper:
        name = "upper"
        is_json = False

        def encode(self, obj: Any) -> bytes:
            if not isinstance(obj, str):
                raise TypeError("strings only")
            return obj.upper().encode()

        def decode(self, data: bytes) -> Any:
            return data.decode()

    bus = make_bus(codec=Upper())
    bus.publish("/c", "hello")
    assert bus.backlog("/c")[0].data == "HELLO"
    with pytest.raises(TypeError, match="/c"):
        bus.publish("/c", 1)


def test_backlog_size_limits_and_clear_every(bus: Bus) -> None:
    for i in range(5):
        bus.publish("/lim", i, max_backlog_size=2)
    assert [m.data for m in bus.backlog("/lim")] == [3, 4]
    bl = bus.backlog("/lim", 0)
    assert bl.gap and bl.first_available == 4 and bl.last_id == 5
    bus.clear_every = 5
    for i in range(5, 9):
        bus.publish("/ce", i, max_backlog_size=2)  # ids 1..4: no trim yet
    assert len(bus.backlog("/ce")) == 4
    bus.publish("/ce", 9, max_backlog_size=2)  # id 5: trim to the last 2
    assert [m.message_id for m in bus.backlog("/ce")] == [4, 5]


def test_size_is_honoured_together_with_age(bus: Bus) -> None:
    # The gem drops max_backlog_size when max_backlog_age is given (quirk #1); shmbus honours both.
    for i in range(3):
        bus.publish("/both", i, max_backlog_age=100, max_backlog_size=1)
    assert [m.data for m in bus.backlog("/both")] == [2]


def test_age_expiry_restarts_ids(bus: Bus) -> None:
    bus.publish("/age", "old", max_backlog_age=0.3)
    bus.publish("/age", "old2", max_backlog_age=0.3)
    assert bus.last_id("/age") == 2
    time.sleep(0.45)
    assert bus.last_id("/age") == 0 and bus.backlog("/age") == []
    assert bus.publish("/age", "new") == 1
    assert [m.data for m in bus.backlog("/age")] == ["new"]
    assert all(m.data != "old" for m in bus.global_backlog())


def test_ring_overwrite_is_reported_never_a_silent_hole(make_bus: Any) -> None:
    bus = make_bus(ring_size=64 << 10)
    bus.publish("/slow", "first")
    for _i in range(2000):
        bus.publish("/fast", "x" * 100)
    bl = bus.backlog("/slow", 0)
    assert bl == [] and bl.gap and bl.first_available == 2 and bl.last_id == 1
    fast = bus.backlog("/fast", 0)
    assert fast.gap and fast.first_available == fast[0].message_id > 1
    assert [m.message_id for m in fast] == list(range(fast.first_available, 2001))
    st = bus.stats()
    assert st.overwritten > 0 and st.oldest_global_id > 1


def test_global_backlog_limit_and_trimmed_messages(make_bus: Any) -> None:
    bus = make_bus(max_global_backlog_size=3)
    for ch in ("/a", "/b", "/a", "/b", "/c"):
        bus.publish(ch, ch, max_backlog_size=1)
    glob = bus.global_backlog()
    # newest 3 global entries, minus those trimmed by the per-channel limit of 1
    assert [(m.global_id, m.channel) for m in glob] == [(3, "/a"), (4, "/b"), (5, "/c")]
    assert [m.global_id for m in bus.global_backlog(4)] == [5]


def test_reset_changes_epoch_and_empties_the_bus(make_bus: Any) -> None:
    bus, peer = make_bus(), make_bus()
    got = collect(peer, "/r")
    bus.publish("/r", 1)
    wait_for(lambda: len(got) == 1)
    e1 = bus.epoch
    e2 = bus.reset()
    assert e2 != e1 and peer.epoch == e2
    assert bus.last_id("/r") == 0 and bus.global_backlog() == []
    assert bus.publish("/r", 2) == 1
    wait_for(lambda: len(got) == 2, what="delivery after reset")
    assert got[1].global_id == 1 and got[1].epoch == e2


def test_off_and_on(bus: Bus) -> None:
    bus.off()
    assert bus.is_off and bus.publish("/o", 1) is None and bus.subscribe("/o", print) is None
    bus.on()
    bus.off(disable_publish=False)
    assert bus.publish("/o", 2) == 1 and bus.subscribe("/o", print) is None
    bus.on()
    got = collect(bus, "/o")
    bus.publish("/o", 3)
    wait_for(lambda: len(got) == 1)
    assert [m.data for m in bus.backlog("/o")] == [2, 3]


def test_destroy_is_idempotent_and_on_revives(make_bus: Any) -> None:
    bus = make_bus()
    bus.publish("/d", 1)
    bus.destroy()
    bus.destroy()
    with pytest.raises(shmbus.BusDestroyed):
        bus.publish("/d", 1)
    bus.on()
    assert bus.publish("/d", 1) == 1  # a fresh segment


def test_client_message_filters_newest_first_all_must_pass(bus: Bus) -> None:
    bus.register_client_message_filter("/test")  # no function: ignored, as in the gem
    bus.register_client_message_filter("/test", lambda m: m.data.get("a", False))
    bus.register_client_message_filter("/test", lambda m: m.data.get("b", False))
    assert len(bus.client_message_filters) == 2
    bus.publish("/test/1", {"a": True, "b": True})
    bus.publish("/test/1", {"a": True})
    bus.publish("/other", {})
    allowed = [bus.allowed_by_filters(m) for m in bus.global_backlog()]
    assert allowed == [True, False, True]


def test_engines_follow_the_iodine_draft(bus: Bus) -> None:
    class Recorder(shmbus.Engine):
        def __init__(self) -> None:
            self.calls: list[tuple[str, str, bool]] = []
            self.published: list[shmbus.Envelope] = []

        def subscribe(self, to: str, is_pattern: bool = False) -> bool:
            self.calls.append(("sub", to, is_pattern))
            return True

        def unsubscribe(self, from_: str, is_pattern: bool = False) -> bool:
            self.calls.append(("unsub", from_, is_pattern))
            raise RuntimeError("engines must not raise; the bus survives it")

        def publish(self, bus: Bus, envelope: shmbus.Envelope) -> int | None:
            self.published.append(envelope)
            return bus.store(envelope)

    a = bus.subscribe("/e1", print)
    rec = Recorder()
    bus.attach(rec)
    assert rec.calls == [("sub", "/e1", False)]  # told about existing subscriptions
    b = bus.subscribe("/e1", print)  # second subscriber of the same channel: no second call
    bus.subscribe("/p/*", print, pattern=True)
    assert rec.calls == [("sub", "/e1", False), ("sub", "/p/*", True)]
    bus.unsubscribe("/e1", a)
    assert rec.calls[-1] == ("sub", "/p/*", True)
    bus.unsubscribe("/e1", b)  # last one: engine told (and its exception swallowed)
    assert rec.calls[-1] == ("unsub", "/e1", False)
    bus.reset_engine(rec)
    assert rec.calls[-1] == ("sub", "/p/*", True)
    # routing publish through an explicit engine, then making it the default
    assert bus.publish("/via", 1, engine=rec) == 1 and rec.published[-1].channel == "/via"
    bus.default = rec
    assert bus.default is rec
    assert bus.publish("/via", 2) == 2 and len(rec.published) == 2
    bus.default = None
    assert isinstance(bus.default, shmbus.SharedMemoryEngine)
    bus.detach(rec)


def test_engine_false_is_process_local(make_bus: Any) -> None:
    bus, peer = make_bus(), make_bus()
    here = collect(bus, "/local")
    there = collect(peer, "/local")
    assert bus.publish("/local", "only here", engine=False) is True
    assert [m.data for m in here] == ["only here"]  # delivered synchronously
    assert bus.last_id("/local") == 0  # nothing stored
    bus.publish("/local", "everyone")
    wait_for(lambda: len(there) == 1)
    assert [m.data for m in there] == ["everyone"]


def test_module_level_default_bus(bus_name: str) -> None:
    shmbus.configure(name=bus_name, ring_size=1 << 20, keepalive_interval=0)
    try:
        assert shmbus.publish("/m", "x") == 1
        assert shmbus.last_id("/m") == 1 and shmbus.last_ids("/m") == {"/m": 1}
        assert [m.data for m in shmbus.backlog("/m")] == ["x"]
        got: list[Message] = []
        shmbus.subscribe("/m", got.append, 0)
        assert [m.data for m in got] == ["x"]
    finally:
        shmbus.default_bus().destroy()


def test_keepalive_publishes_and_health_reports(make_bus: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import shmbus.bus as busmod
    import shmbus.bus.listener

    monkeypatch.setattr(shmbus.bus.listener, "MIN_KEEPALIVE", 0)
    bus = make_bus(keepalive_interval=0.1)
    bus.subscribe("/k", print)
    wait_for(lambda: bus.last_id(busmod.KEEPALIVE_CHANNEL) >= 2, what="keepalive publishes")
    (m,) = bus.backlog(busmod.KEEPALIVE_CHANNEL, bus.last_id(busmod.KEEPALIVE_CHANNEL) - 1)
    assert m.user_ids == [-1]  # never delivered to HTTP clients
    h = bus.health()
    assert h["listening"] and h["attached"] and h["seconds_since_last_message"] < 5
    bus.stop_listener()
    assert not bus.listening


def test_file_backed_log_survives_every_process_detaching(tmp_path: Any, bus_name: str) -> None:
    path = str(tmp_path / "bus.log")
    bus = Bus(bus_name, path=path, ring_size=1 << 20, keepalive_interval=0, create=True)
    bus.publish("/p", "kept")
    epoch = bus.epoch
    bus.close()
    again = Bus(bus_name, path=path, keepalive_interval=0, create=True)
    try:
        assert again.epoch == epoch and [m.data for m in again.backlog("/p")] == ["kept"]
        assert again.publish("/p", "more") == 2
    finally:
        again.destroy()
    import os

    assert not os.path.exists(path)


def test_file_backed_log_from_before_a_reboot_gets_fresh_kernel_state(tmp_path: Any, bus_name: str) -> None:
    from shmbus.segment import layout as segment

    path = str(tmp_path / "bus.log")
    bus = Bus(bus_name, path=path, ring_size=1 << 20, keepalive_interval=0, create=True)
    bus.publish("/p", 1)
    bus.segment.mm[segment._OFF_BOOT : segment._OFF_BOOT + 16] = b"\x01" * 16  # as if written before a reboot
    bus.segment.mm[segment._OFF_MUTEX : segment._OFF_MUTEX + 8] = b"\xff" * 8  # a lock word naming a dead thread
    bus.close()
    again = Bus(bus_name, path=path, keepalive_interval=0, create=True)
    try:
        assert again.publish("/p", 2) == 2  # would block forever on the stale mutex without re-initialisation
        assert [m.data for m in again.backlog("/p")] == [1, 2]
    finally:
        again.destroy()


def test_foreign_and_incompatible_segments_are_refused(bus_name: str) -> None:
    import os
    import struct

    from shmbus.segment import layout as segment

    path = segment.segment_path(bus_name)
    with open(path, "wb") as f:
        f.write(b"not a bus" * 1000)
    try:
        with pytest.raises(shmbus.NotASegment):
            Bus(bus_name, keepalive_interval=0, create=True).publish("/x", 1)
        with open(path, "rb") as f:
            assert f.read(9) == b"not a bus"  # untouched
    finally:
        os.unlink(path)
    bus = Bus(bus_name, ring_size=1 << 20, keepalive_interval=0, create=True)
    bus.publish("/x", 1)
    struct.pack_into("<I", bus.segment.mm, 8, segment.LAYOUT_VERSION + 1)
    try:
        with pytest.raises(shmbus.LayoutMismatch, match="layout version"):
            Bus(bus_name, keepalive_interval=0, create=True).last_id("/x")
    finally:
        bus.destroy()


def test_channel_table_evicts_only_channels_without_retained_messages(make_bus: Any) -> None:
    bus = make_bus(max_channels=16, ring_size=64 << 10)
    for i in range(14):
        bus.publish(f"/c{i}", i)
    with pytest.raises(shmbus.ChannelTableFull):
        for i in range(14, 40):
            bus.publish(f"/c{i}", i)  # every channel still has its message in the ring
    assert [m.data for m in bus.backlog("/c0")] == [0]  # nothing lost by the refusal
    for _ in range(1000):
        bus.publish("/c1", "x" * 200)  # overwrite the ring: old channels' messages are gone
    assert bus.publish("/fresh", 1) == 1  # now a slot can be reused


def test_a_lingering_tap_gets_what_was_published_meanwhile_as_one_batch(bus: Bus) -> None:
    """``tap(fn, linger)``: after a batch the listener waits ``linger`` before it looks again (one wake-up per
    window instead of one per message); a subscription turns it off; the first message is never delayed."""
    batches: list[list[int]] = []
    fn = lambda msgs: batches.append([m.message_id for m in msgs])  # noqa: E731
    bus.tap(fn, linger=0.5)
    assert bus.subscriptions.linger() == 0.5
    bus.publish("/l", 1)
    wait_for(lambda: batches, what="the first batch")
    for n in range(2, 7):  # while the listener lingers after the first batch
        bus.publish("/l", n)
        time.sleep(0.01)
    wait_for(lambda: sum(map(len, batches)) == 6, what="every message")
    assert batches == [[1], [2, 3, 4, 5, 6]]
    got: list[Message] = []
    bus.subscribe("/other", got.append)
    assert bus.subscriptions.linger() == 0.0  # a subscriber expects each message at once
    with pytest.raises(ValueError):
        bus.tap(fn, linger=-1)
    bus.untap(fn)
    assert not bus.subscriptions.lingering()
