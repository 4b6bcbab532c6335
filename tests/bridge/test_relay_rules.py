"""Every rule of the relay (``adapters/bridge/relay.py``'s module doc, the loss, seal and stall rules), each
against the in-memory backend: the relay is driven one action at a time on a fake clock, so each test says exactly
what the relay read, stored, counted and reported, with no server and no sleep."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from shmbus.adapters.bridge.events import ASK_GONE, SETTLE, Read, StoreRows
from shmbus.adapters.bridge.memory import MemoryBackend
from shmbus.adapters.bridge.seals import mac
from shmbus.adapters.bridge.wire import format_line

from .conftest import Host, datas, relaying

Make = Callable[..., Host]


# ------------------------------------------------------------------------------ notices are doorbells
def test_a_forged_notice_stores_nothing_and_costs_one_read(make_host: Make, backend: MemoryBackend) -> None:
    a = make_host("a", backend, relay=False)
    b = relaying(make_host, backend)
    a.bus.publish("/c", "real")
    b.ring()
    reads = backend.calls["read_after"]
    backend.notify(b'99|1|/c|{"data":"forged"}', b"not a line")
    done = b.ring()
    assert [a for a in done if isinstance(a, Read)] == [Read(1, 1000)]  # one read after the position, nothing more
    assert backend.calls["read_after"] == reads + 1
    assert datas(b) == ["real"] and b.bus.segment.global_id() == 1
    assert b.status.relay_lost == 0 and b.status.resets == 0


def test_a_stale_or_repeated_notice_neither_stores_twice_nor_resets(make_host: Make, backend: MemoryBackend) -> None:
    a = make_host("a", backend, relay=False)
    b = relaying(make_host, backend)
    for i in range(3):
        a.bus.publish("/c", i)
    b.ring()
    line = format_line(2, 2, "/c", b'{"data":1}')
    named = backend.calls["history_id"]
    backend.notify(line, line)  # repeated, and below the position: stale
    done = b.ring()
    assert backend.calls["history_id"] == named + 1  # a stale id is looked at at once (a new history's?)...
    assert not [x for x in done if isinstance(x, (Read, StoreRows))]  # ...but it is no history's news: no read
    backend.notify(line)  # again within 0.1 s: no second check
    b.ring()
    assert backend.calls["history_id"] == named + 1
    assert datas(b) == [0, 1, 2] and b.status.resets == 0 and b.status.relayed == 3


# ------------------------------------------------------------------------------ sealed lines
def test_a_sealed_run_that_continues_the_position_is_stored_without_a_read(
    make_host: Make, backend: MemoryBackend
) -> None:
    a = make_host("a", backend, relay=False)
    b = relaying(make_host, backend)
    reads = backend.calls["read_after"]
    with a.engine.batch():
        for i in range(3):
            a.bus.publish("/c", i)  # one publish call: one run, one seal
    done = b.ring()
    assert [x for x in done if isinstance(x, StoreRows)] == [StoreRows([row]) for row in sorted(backend.rows.values())]
    assert backend.calls["read_after"] == reads and datas(b) == [0, 1, 2] and b.status.relayed == 3


def _hidden(backend: MemoryBackend, data: str) -> int:
    """A message the backend holds but no notice announced."""
    gid = backend.begin()
    backend.commit(gid, "/c", b'{"data":"%s"}' % data.encode())
    return gid


@pytest.mark.parametrize("forgery", ["another key", "another history", "a missing line"])
def test_a_seal_that_does_not_verify_costs_a_read_and_the_backends_message_is_stored(
    make_host: Make, backend: MemoryBackend, forgery: str
) -> None:
    b = relaying(make_host, backend)
    gid = _hidden(backend, "true")
    assert backend.key is not None
    lines = [format_line(gid, gid, "/c", b'{"data":"evil"}'), format_line(gid + 1, 1, "/c", b'{"data":"evil"}')]
    key, history, sealed = backend.key, backend.history, lines
    if forgery == "another key":
        key = b"k" * 32
    elif forgery == "another history":
        history += 1
    else:
        lines = lines[:1]
    backend.notify(*lines, seals={gid: (gid + 1, mac("sha256", key, history, sealed))})
    done = b.ring()
    assert [x for x in done if isinstance(x, Read)] == [Read(0, 1000)]
    assert datas(b) == ["true"]


def test_a_run_its_publisher_landed_is_not_verified_nor_stored_again(make_host: Make, backend: MemoryBackend) -> None:
    b = relaying(make_host, backend)
    b.bus.publish("/c", "mine")  # b's publisher lands it itself (it directly follows the segment's newest)
    reads = backend.calls["read_after"]
    done = b.ring()
    assert not [x for x in done if isinstance(x, (Read, StoreRows))]
    assert backend.calls["read_after"] == reads and datas(b) == ["mine"] and b.status.relayed == 0


# ------------------------------------------------------------------------------ loss is counted
def test_ids_trimmed_before_the_read_are_lost_counted_and_said_once(
    make_host: Make, backend: MemoryBackend, caplog: pytest.LogCaptureFixture
) -> None:
    a = make_host("a", backend, relay=False)
    b = relaying(make_host, backend)
    a.bus.publish("/c", 0)
    b.ring()
    b.down()
    for i in range(1, 10):
        a.bus.publish("/c", i)
    backend.trim(6)  # ids 2-6 are gone before b read them
    with caplog.at_level(logging.WARNING, "shmbus.memory"):
        b.start()
        b.idle()
    assert datas(b) == [0, 6, 7, 8, 9] and b.status.relay_lost == 5
    said = [r.getMessage() for r in caplog.records if "gone from the backend" in r.getMessage()]
    assert len(said) == 1 and "5 message(s) between ids 2 and 6" in said[0], said


def test_a_new_host_owes_nothing_trimmed_before_it_began(make_host: Make, backend: MemoryBackend) -> None:
    a = make_host("a", backend, relay=False)
    for i in range(10):
        a.bus.publish("/c", i)
    backend.trim(5)
    b = relaying(make_host, backend)
    assert datas(b) == [5, 6, 7, 8, 9] and b.status.relay_lost == 0


def test_a_message_gone_from_its_channel_is_lost_and_the_next_stored(make_host: Make, backend: MemoryBackend) -> None:
    a = make_host("a", backend, relay=False)
    b = relaying(make_host, backend)
    a.bus.publish("/c", "seen")
    b.ring()
    b.down()
    for i in range(3):
        a.bus.publish("/c", i)
    backend.expire(3)  # its id is known, its message gone (a channel trimmed to its newest)
    b.start()
    b.idle()
    assert datas(b) == ["seen", 0, 2] and b.status.relay_lost == 1 and b.status.relay.position == 4


def test_on_sparse_ids_a_loss_breaks_the_chains_so_a_backlog_read_across_it_says_gap(
    make_host: Make, sparse_backend: MemoryBackend
) -> None:
    a = make_host("a", sparse_backend, relay=False)
    b = relaying(make_host, sparse_backend)
    a.bus.publish("/c", 0)
    b.ring()
    b.down()
    for i in range(1, 4):
        a.bus.publish("/c", i)
    sparse_backend.trim(3)
    b.start()
    actions = b.idle()
    assert "break_chains" in [getattr(x, "what", "") for x in actions]
    assert b.status.relay_lost == 2
    backlog = b.bus.backlog("/c", 1)
    assert backlog.gap and [m.data for m in backlog] == [3]


def test_a_hole_is_waited_for_once_and_stored_when_its_writer_commits(
    make_host: Make, sparse_backend: MemoryBackend
) -> None:
    a = make_host("a", sparse_backend, relay=False)
    b = relaying(make_host, sparse_backend)
    hole = sparse_backend.begin()  # a transaction drew id 1 and has not committed
    a.bus.publish("/c", "after")
    sparse_backend.on_settle = lambda: sparse_backend.commit(hole, "/c", b'{"data":"late"}')
    done = b.ring()
    assert [x for x in done if isinstance(x, Read) or x == SETTLE][-3:] == [Read(0, 1000), SETTLE, Read(0, 1000)]
    assert datas(b) == ["late", "after"] and b.status.relay_lost == 0


def test_a_hole_whose_writer_outlived_the_timeout_is_lost(make_host: Make, sparse_backend: MemoryBackend) -> None:
    a = make_host("a", sparse_backend, relay=False)
    b = relaying(make_host, sparse_backend)
    hole = sparse_backend.begin()
    a.bus.publish("/c", "after")
    b.ring()
    assert datas(b) == ["after"] and b.status.relay_lost == 1
    sparse_backend.commit(hole, "/c", b'{"data":"too late"}')
    b.ring()
    assert datas(b) == ["after"]  # never stored: the position is past it (it was counted lost)


def test_a_rolled_back_id_is_no_loss(make_host: Make, sparse_backend: MemoryBackend) -> None:
    a = make_host("a", sparse_backend, relay=False)
    b = relaying(make_host, sparse_backend)
    hole = sparse_backend.begin()
    a.bus.publish("/c", "after")
    sparse_backend.on_settle = lambda: sparse_backend.rollback(hole)
    done = b.ring()
    assert ASK_GONE in done and SETTLE in done
    assert datas(b) == ["after"] and b.status.relay_lost == 0


def test_a_message_too_large_for_this_hosts_ring_is_a_loss_with_its_reason(
    make_host: Make, backend: MemoryBackend, caplog: pytest.LogCaptureFixture
) -> None:
    a = make_host("a", backend, relay=False, bus_options={"ring_size": 4 << 20})
    b = relaying(make_host, backend, bus_options={"ring_size": 64 << 10})
    with caplog.at_level(logging.WARNING, "shmbus.memory"):
        a.bus.publish("/c", "small")
        big = a.bus.publish("/c", "x" * (40 << 10))
        a.bus.publish("/c", "after")
        b.ring()
    assert datas(b) == ["small", "after"] and b.status.relay_lost == 1 and b.status.relay.position == 3
    assert [r for r in caplog.records if f"message {big} is too large for bus {b.bus.name!r}" in r.getMessage()]


def test_an_undecodable_message_is_skipped_and_counted(
    make_host: Make, backend: MemoryBackend, caplog: pytest.LogCaptureFixture
) -> None:
    b = relaying(make_host, backend)
    gid = backend.begin()
    backend.commit(gid, "/c", b"not an envelope")
    _hidden(backend, "next")
    backend.notify(b"%d|" % (gid + 1))  # a doorbell
    with caplog.at_level(logging.WARNING, "shmbus.memory"):
        b.ring()
    assert datas(b) == ["next"] and b.status.unrelayable == 1 and b.status.relay_lost == 0
    assert [r for r in caplog.records if f"cannot store message {gid} locally" in r.getMessage()]


# ------------------------------------------------------------------------------ a reset only for another history
def test_another_history_resets_the_bus_once_and_its_messages_are_delivered(
    make_host: Make, backend: MemoryBackend, caplog: pytest.LogCaptureFixture
) -> None:
    a = make_host("a", backend, relay=False)
    b = relaying(make_host, backend)
    for i in range(3):
        a.bus.publish("/c", f"old {i}")
    b.ring()
    epoch = b.bus.epoch
    backend.flush()  # a FLUSHDB: ids restart at 1 in a history with a new name
    with caplog.at_level(logging.WARNING, "shmbus.memory"):
        a.bus.publish("/c", "new")  # id 1 again: below b's position (a stale-looking notice), and sealed for it
        b.ring()
        b.ring()
    assert b.bus.epoch != epoch and b.status.resets == 1 and datas(b) == ["new"]
    assert b.bus.segment.history_id() == backend.history and b.status.relay.position == 1
    assert len([r for r in caplog.records if "resetting the bus" in r.getMessage()]) == 1


def test_the_same_history_never_resets_whatever_the_ids_say(make_host: Make, backend: MemoryBackend) -> None:
    """The relay's host lands its own publishes (the segment runs ahead of the relay's position), notices come
    late, periodic checks run: the history's name is unchanged, so nothing resets."""
    a = make_host("a", backend, relay=False)
    b = relaying(make_host, backend)
    for i in range(5):
        b.bus.publish("/c", f"b{i}")  # landed by b's publisher before its relay reads anything
        a.bus.publish("/c", f"a{i}")
    for _ in range(12):  # three seconds of doorbell waits: periodic history checks
        b.ring()
    assert b.status.resets == 0 and len(datas(b)) == 10 and backend.calls["history_continues"] == 0


def test_a_history_the_backend_cannot_name_decides_nothing(make_host: Make, backend: MemoryBackend) -> None:
    a = make_host("a", backend, relay=False)
    b = relaying(make_host, backend)
    recorded = b.bus.segment.history_id()
    backend.history = 0  # a replica that has no name yet
    for i in range(3):
        a.bus.publish("/c", i)  # unsealed now (no name to seal for): read, and gone by the ids
    for _ in range(5):
        b.ring()
    assert datas(b) == [0, 1, 2] and b.status.resets == 0 and b.bus.segment.history_id() == recorded


def test_a_segment_that_recorded_no_history_adopts_one_that_continues_it(
    make_host: Make, backend: MemoryBackend
) -> None:
    """An older segment (no name recorded) is checked on its messages (``history_continues``), not reset."""
    a = make_host("a", backend, relay=False)
    b = relaying(make_host, backend)
    a.bus.publish("/c", "kept")
    b.ring()
    b.bus.segment.set_history_id(0)
    for _ in range(5):  # a second of doorbell waits: the periodic check
        b.ring()
    assert backend.calls["history_continues"] == 1 and b.status.resets == 0 and datas(b) == ["kept"]
    assert b.bus.segment.history_id() == backend.history


def test_a_page_of_another_history_is_decided_before_any_of_it_is_stored(
    make_host: Make, backend: MemoryBackend
) -> None:
    a = make_host("a", backend, relay=False)
    b = relaying(make_host, backend)
    a.bus.publish("/c", "old")
    b.ring()
    backend.flush()
    for i in range(3):
        a.bus.publish("/c", f"new {i}")  # ids 1-3 of the new history; b's position is 1
    backend.notify(b"9|")  # a doorbell above the position: b reads, and the page names another history
    done = b.ring()
    stores = [x for x in done if isinstance(x, StoreRows)]
    assert b.status.resets == 1 and datas(b) == ["new 0", "new 1", "new 2"]
    assert "reset_bus" in [getattr(x, "what", "") for x in done[: done.index(stores[0])]]


# ------------------------------------------------------------------------------ no duplicate window
def test_a_read_starts_after_the_segments_newest_and_stores_nothing_twice(
    make_host: Make, backend: MemoryBackend
) -> None:
    b = make_host("b", backend)
    for i in range(3):
        b.bus.publish("/c", i)  # its own publisher landed 1-3 before it relays
    b.start()
    done = b.idle()
    assert next(x for x in done if isinstance(x, Read)) == Read(3, 1000)
    assert datas(b) == [0, 1, 2] and b.status.relayed == 0 and b.status.relay.position == 3
