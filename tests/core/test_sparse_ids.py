"""Sparse message ids (the PostgreSQL engine's: a message's id is its global id, so a channel's ids have gaps).

Without the segment's sparse flag every jump in a channel's ids starts a new chain (a gap is reported); with it
the chain continues, the backlog limit is a count of messages, ``-n`` look-backs count messages, and gap
reports stay exact. Each test shows the difference on the same data."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shmbus import Bus
from shmbus.engines import Envelope


def store(bus: Bus, channel: str, gid: int, data: Any = None) -> None:
    env = Envelope(channel, None, bus.codec.encode(data if data is not None else gid), b"", 1 << 30, 604800.0)
    assert bus.store(env, global_id=gid, message_id=gid) == gid


def interleave(bus: Bus, n: int, every: int = 3) -> list[int]:
    """Global ids 1..n: every ``every``-th goes to /a, the rest to /b; returns /a's ids."""
    ids = []
    for gid in range(1, n + 1):
        ch = "/a" if gid % every == 0 else "/b"
        store(bus, ch, gid)
        if ch == "/a":
            ids.append(gid)
    return ids


def test_a_channel_with_sparse_ids_keeps_one_chain_and_reports_no_gap(make_bus: Any) -> None:
    bus = make_bus()
    bus.segment.set_sparse_ids()
    a = interleave(bus, 30)
    assert [m.message_id for m in bus.backlog("/a")] == a
    for i, after in enumerate(a):
        bl = bus.backlog("/a", after)
        assert [m.message_id for m in bl] == a[i + 1 :] and not bl.gap
    assert bus.last_id("/a") == a[-1]


def test_without_the_flag_a_jump_starts_a_new_chain(make_bus: Any) -> None:
    bus = make_bus()
    a = interleave(bus, 30)
    bl = bus.backlog("/a", a[0])
    assert [m.message_id for m in bl] == [a[-1]] and bl.gap  # why the engine must set the flag


def test_the_backlog_limit_is_a_count_of_messages(make_bus: Any) -> None:
    bus = make_bus(max_backlog_size=4)
    bus.segment.set_sparse_ids()
    a = interleave(bus, 60)  # 20 messages on /a, ids 3, 6, ... 60
    bl = bus.backlog("/a")
    assert [m.message_id for m in bl] == a[-4:] and bl.gap  # the older 16 count as trimmed
    inside = bus.backlog("/a", a[-5])  # the client has the newest trimmed one: nothing it lacks is gone
    assert [m.message_id for m in inside] == a[-4:] and not inside.gap
    behind = bus.backlog("/a", a[-6])
    assert [m.message_id for m in behind] == a[-4:] and behind.gap and behind.first_available == a[-5] + 1


def test_look_back_counts_messages(make_bus: Any) -> None:
    bus = make_bus()
    bus.segment.set_sparse_ids()
    a = interleave(bus, 30)
    for n in (1, 2, 5, 10, 50):
        after = bus.look_back("/a", n)
        assert [m.message_id for m in bus.backlog("/a", after)] == a[-n:]
    got: list[Any] = []
    bus.subscribe("/a", got.append, last_id=-3)  # the gem's -3: the last two
    assert [m.message_id for m in got] == a[-2:]


def test_look_back_with_contiguous_ids_is_id_arithmetic(make_bus: Any) -> None:
    bus = make_bus()
    for i in range(10):
        bus.publish("/c", i)
    assert bus.look_back("/c", 3) == 7 and bus.look_back("/c", 30) == 0 and bus.look_back("/c", 0) == 10


def test_a_ring_overwrite_is_a_gap_only_for_clients_older_than_the_ring(make_bus: Any) -> None:
    bus = make_bus(ring_size=64 << 10)
    bus.segment.set_sparse_ids()
    store(bus, "/quiet", 1)
    gid = 1
    while bus.segment.oldest_global_id() <= 1:  # /b fills the ring until /quiet's message is overwritten
        gid += 1
        store(bus, "/b", gid, "x" * 200)
    last = gid + 5
    store(bus, "/quiet", last)
    oldest = bus.segment.oldest_global_id()
    assert not bus.backlog("/quiet", oldest - 1).gap  # the client is within the ring: nothing lost
    behind = bus.backlog("/quiet", 0)
    assert behind.gap and [m.message_id for m in behind] == [last]  # message 1 is gone: a true gap


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(["/a", "/b", "/c"]), min_size=1, max_size=60), st.integers(1, 8))
def test_any_interleaving_reads_back_exactly(bus_name: str, channels: list[str], size: int) -> None:
    bus = Bus(bus_name, ring_size=1 << 20, keepalive_interval=0, max_backlog_size=size, create=True)  # one per example
    try:
        bus.segment.set_sparse_ids()
        ids: dict[str, list[int]] = {}
        for gid, ch in enumerate(channels, 1):
            store(bus, ch, gid)
            ids.setdefault(ch, []).append(gid)
        for ch, mine in ids.items():
            kept = mine[-size:]
            for after in [0, *mine]:
                bl = bus.backlog(ch, after)
                assert [m.message_id for m in bl] == [i for i in kept if i > after]
                lost = [i for i in mine if after < i and i not in kept]
                # before the channel's first message the segment cannot know whether older ones existed (a relay
                # may have started late): it says gap, and an engine with the history (PostgreSQL) answers
                unknown = after < mine[0] - 1
                assert bl.gap == (bool(lost) or unknown), (ch, after, mine, size)
    finally:
        bus.destroy()
