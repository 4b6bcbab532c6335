"""What the append does while it holds the writers' lock, and what it does before: the record is built before the
lock and stored whole, invisible until the commit; a channel's slot looked up before the lock is looked up again if
the table changed meanwhile; the calls made holding the lock keep the GIL."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any

import pytest

from shmbus import Bus, _native
from shmbus.segment import layout


def test_the_calls_made_holding_the_lock_keep_the_gil() -> None:
    """A call that releases the GIL takes it back on return: a trylock that took the bus's lock would then wait for
    the GIL (the switch interval, if another thread runs Python) while every other writer waits for the lock."""
    for fn in (_native._trylock, _native._unlock, _native._consistent, _native._syscall_held):
        assert fn._flags_ & ctypes._FUNCFLAG_PYTHONAPI, fn  # type: ignore[attr-defined]
    # what blocks still lets the process's other threads run
    for fn in (_native._timedlock, _native._syscall):
        assert not fn._flags_ & ctypes._FUNCFLAG_PYTHONAPI, fn  # type: ignore[attr-defined]


def test_a_record_is_stored_whole_and_is_invisible_until_the_commit(make_bus: Callable[..., Bus]) -> None:
    """The record is built before the lock; under it, its ids are filled in and it is copied in one store. Right
    after that store (the writer still holds the lock) the ring holds the whole record, with its ids, and no reader
    sees it: ``head`` has not moved."""
    bus = make_bus()
    seg = bus.segment
    bus.publish("/r", "first", site_id="s")  # a known channel: the record is the publish's first store
    head, gid = seg.head(), seg.global_id()
    seen: list[Any] = []

    def at_the_first_store() -> None:
        seen.append((bytes(seg.mm[seg.ring_off + head : seg.ring_off + head + 128]), seg.head(), seg.read_since(head)))

    seg._after_store(1, at_the_first_store)
    bus.publish("/r", "second", site_id="s")
    [(raw, head_then, (records, _, _))] = seen
    length, kind, r_gid, r_mid, prev, _ts, ch_len, site_len, meta_len, payload_len = layout._REC.unpack_from(raw)
    assert (kind, r_gid, r_mid, prev) == (layout.KIND_MSG, gid + 1, 2, 1)  # prev: the first record's position + 1
    fields = raw[layout.REC_HDR : layout.REC_HDR + ch_len + site_len + payload_len]
    assert fields == b"/r" + bus._names.site_key("s") + b'"second"' and meta_len == 0
    (footer,) = layout._U32.unpack_from(seg.mm, seg.ring_off + head + length - 4)
    assert footer == length and length % layout.ALIGN == 0
    assert head_then == head and records == []  # not committed: invisible
    [record] = seg.read_since(head)[0]
    assert (record.global_id, record.message_id, record.payload) == (gid + 1, 2, b'"second"')


def test_a_slot_looked_up_before_the_lock_is_looked_up_again_if_the_table_changed(
    make_bus: Callable[..., Bus], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The append looks the channel's slot up in this process's cache before it takes the lock. Here, between that
    lookup and the lock, another thread's publish evicts the channel (a full table) and its read moves the cache to
    the new table generation: the slot is stale, and the append must find the channel again rather than write its
    state into a slot that is no longer its own."""
    bus = make_bus(max_channels=16, ring_size=64 << 10)
    bus.publish("/x", "old")  # the oldest channel: the one an eviction picks, once its message is gone
    for i in range(12):  # with /fill, 14 channels: 9/10 of the table, where a new channel evicts one
        bus.publish(f"/c{i}", i)
    for _ in range(80):  # 80 KiB through a 64 KiB ring: every message above is gone
        bus.publish("/fill", "f" * 1000)
    real_lock = _native.mutex_lock
    interleaved = threading.Event()

    def lock_after_the_other_thread(ptr: Any, timeout: float) -> bool:
        if not interleaved.is_set():
            interleaved.set()
            other = threading.Thread(target=lambda: (bus.publish("/y", "y"), bus.last_id("/y")))
            other.start()  # takes the real lock: this thread does not hold it yet
            other.join()
        return real_lock(ptr, timeout)

    monkeypatch.setattr(_native, "mutex_lock", lock_after_the_other_thread)
    assert bus.publish("/x", "new") == 1  # /x was evicted: its ids start again
    monkeypatch.undo()
    assert interleaved.is_set()
    assert bus.last_id("/x") == 1 and [m.data for m in bus.backlog("/x")] == ["new"]
    assert bus.last_id("/y") == 1 and [m.data for m in bus.backlog("/y")] == ["y"]
    assert bus.last_id("/fill") == 80
