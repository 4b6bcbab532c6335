"""A writer SIGKILLed, or stopped by an exception, right after each single store of a publish leaves "committed" or
"not committed", nothing else.

``Segment._kill_after_store(k)`` (a test hook) makes the publishing process kill itself right after its k-th store to
the segment; ``Segment._after_store(k, action)`` raises there instead, as a signal handler's exception would. For
every k of the append path, in every shape of append (plain, first publish of a channel, a full ring whose tail must
advance, a pad record at the ring's end, a channel-table eviction), a fresh process then checks what lock-free
readers see, and what the next publish (which runs the repair: after EOWNERDEAD, or the one the interrupted writer
left due) and a live subscriber see after it.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest

from shmbus import Bus, _native

RING = 64 << 10
CH = "/kp"


def _in_child(fn: Callable[[], Any]) -> int:
    """Run ``fn`` in a forked child; return its wait status decoded (negative: killed by that signal)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 0
        try:
            fn()
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _snapshot(bus: Bus, channels: list[str]) -> dict[str, Any]:
    return {
        "last": {c: bus.last_id(c) for c in channels},
        "backlog": {c: [(m.message_id, m.data) for m in bus.backlog(c)] for c in channels},
        "gids": [m.global_id for m in bus.global_backlog()],
        "gid": bus.segment.global_id(),
    }


# --------------------------------------------------------------------------- scenarios: (prepare, the killed publish)
def _plain(bus: Bus) -> tuple[str, Any]:
    for i in range(3):
        bus.publish(CH, i)
    return CH, "fourth"


def _first_publish_of_a_channel(bus: Bus) -> tuple[str, Any]:
    bus.publish("/other", 1)
    return "/brand-new", "first"


def _full_ring_advances_tail(bus: Bus) -> tuple[str, Any]:
    for i in range(90):  # > 64 KiB of 1 KiB records: the ring has wrapped, every publish now advances tail
        bus.publish(CH, f"{i:04d}" + "x" * 1000)
    return CH, "y" * 1000


def _pad_at_ring_end(bus: Bus) -> tuple[str, Any]:
    seg = bus.segment
    while RING - seg.head() % RING > 6000:
        bus.publish(CH, "z" * 1000)
    left = RING - seg.head() % RING
    return CH, "p" * left  # cannot fit in what is left: a PAD record, then the record at the ring's start


def _table_eviction(bus: Bus) -> tuple[str, Any]:
    for i in range(13):  # with CH, 14 of 16 slots: the next new channel evicts one whose messages are gone
        bus.publish(f"/old{i}", i)
    for _ in range(80):
        bus.publish(CH, "w" * 1000)  # overwrite the old channels' messages
    return "/newcomer", "evicts"


SCENARIOS = {
    "plain": (_plain, {}),
    "first-publish": (_first_publish_of_a_channel, {}),
    "full-ring": (_full_ring_advances_tail, {}),
    "pad": (_pad_at_ring_end, {}),
    "eviction": (_table_eviction, {"max_channels": 16}),
}


def _verify(name: str, options: dict[str, Any], channel: str, data: Any, before: dict[str, Any], out: Any) -> None:
    """In a fresh process: classify the state, check it, then publish (repair) and receive live."""
    bus = Bus(name, keepalive_interval=0, ring_size=RING, max_backlog_size=100_000, create=True, **options)
    channels = sorted(before["last"])
    now = _snapshot(bus, channels)  # lock-free: no repair has run yet
    committed = now["last"][channel] == before["last"][channel] + 1
    report: dict[str, Any] = {"committed": committed}
    for c in channels:
        if c != channel and not before["backlog"][c]:
            continue  # nothing retained: such a channel may be evicted from the table (its ids then restart)
        expect = before["last"][c] + (1 if committed and c == channel else 0)
        assert now["last"][c] == expect, (c, now["last"][c], expect)
    new_entries = now["backlog"][channel]
    if committed:
        assert new_entries[-1] == (before["last"][channel] + 1, data)
        assert now["gids"][-1] == before["gid"] + 1
        assert now["gid"] in (before["gid"], before["gid"] + 1)  # global_id is stored after head
    else:
        assert not new_entries or new_entries[-1] == before["backlog"][channel][-1]
        assert not now["gids"] or now["gids"][-1] == before["gid"]
        assert now["gid"] == before["gid"]
    # every id a reader can still see is one that was there before (or the new one), never a reissued one
    for c in channels:
        old = dict(before["backlog"][c])
        for mid, value in now["backlog"][c]:
            if c == channel and committed and mid == before["last"][c] + 1:
                continue
            assert old.get(mid) == value, (c, mid)
        ids = [mid for mid, _ in now["backlog"][c]]
        assert ids == list(range(ids[0], ids[0] + len(ids))) if ids else True
    # a live subscriber in this process gets the next publish; the publish runs the repair and continues the ids
    got: list[Any] = []
    arrived = threading.Event()

    def on_message(msg: Any) -> None:
        got.append((msg.message_id, msg.data))
        arrived.set()

    bus.subscribe(channel, on_message)
    next_id = bus.publish(channel, "after")
    assert next_id == now["last"][channel] + 1
    assert arrived.wait(10), "the live subscriber got nothing after the repair"
    assert got == [(next_id, "after")]
    after = _snapshot(bus, channels)
    assert after["gids"][-1] == after["gid"] == (now["gids"][-1] if now["gids"] else before["gid"]) + 1
    assert after["backlog"][channel][-1] == (next_id, "after")
    assert sorted(after["gids"]) == after["gids"] and len(set(after["gids"])) == len(after["gids"])
    report["repaired"] = bus.stats().repairs >= 1
    bus.close()
    out.write(json.dumps(report).encode())
    out.flush()


class _Interrupted(BaseException):
    """What a signal handler raises mid-publish (KeyboardInterrupt, a timeout): not an ``Exception``."""


def _interrupt() -> None:
    raise _Interrupted


#: How the writer is stopped after its k-th store: SIGKILL (the lock's owner dies: EOWNERDEAD), or an exception, the
#: way a signal handler's lands (the writer lives on and the lock is released: its repair is left due).
STOPS = {"killed": -signal.SIGKILL, "interrupted": 3}


@pytest.mark.parametrize("stop", sorted(STOPS))
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_a_writer_stopped_after_any_store_leaves_committed_or_not(scenario: str, stop: str, bus_name: str) -> None:
    prepare, options = SCENARIOS[scenario]
    outcomes: list[bool] = []
    k = 0
    while True:
        k += 1
        assert k < 64, "the append path never completed: the hook counts more stores than an append makes"
        name = f"{bus_name}_{k}"
        bus = Bus(name, keepalive_interval=0, ring_size=RING, max_backlog_size=100_000, create=True, **options)
        try:
            channel, data = prepare(bus)
            before = _snapshot(bus, sorted({channel, *bus.last_ids(channel)} | _channels(bus)))

            def stopped_publish(k: int = k, channel: str = channel, data: Any = data, name: str = name) -> None:
                writer = Bus(
                    name, keepalive_interval=0, ring_size=RING, max_backlog_size=100_000, create=True, **options
                )
                if stop == "killed":
                    writer.segment._kill_after_store(k)
                else:
                    writer.segment._after_store(k, _interrupt)
                try:
                    writer.publish(channel, data)
                except _Interrupted:
                    assert not _native.mutex_held(writer.segment._mutex_ptr), "the interrupted writer kept the lock"
                    assert _native.mutex_holder_pid(writer.segment._mutex_ptr) == 0
                    os._exit(STOPS["interrupted"])

            status = _in_child(stopped_publish)
            if status == 0:
                break  # the publish completed before its k-th store: every stop point has been tried
            assert status == STOPS[stop], f"the writer failed instead of being {stop} (status {status})"
            r, w = os.pipe()
            reader = os.fdopen(r, "rb")
            with os.fdopen(w, "wb") as out:
                code = _in_child(functools.partial(_verify, name, options, channel, data, before, out))
            report = json.loads(reader.read() or b"{}")
            reader.close()
            assert code == 0, f"{stop} after store {k}: the fresh process found an inconsistent bus"
            assert report["repaired"], f"{stop} after store {k}: the repair never ran"
            outcomes.append(report["committed"])
        finally:
            bus.destroy()
    assert k > 4, f"only {k - 1} kill points: the hook does not see the append's stores"
    # the commit is a single store: every kill before it is "not committed", every kill after it "committed"
    assert outcomes == sorted(outcomes), outcomes
    assert False in outcomes and True in outcomes, outcomes


def _channels(bus: Bus) -> set[str]:
    return {info.key.decode().partition("$|$")[0] for info in bus.segment.iter_channels()}


def test_a_fresh_interpreter_reads_a_bus_left_by_a_killed_writer(bus_name: str) -> None:
    """The same check across an exec boundary: nothing of the writer's process state is inherited."""
    bus = Bus(bus_name, keepalive_interval=0, ring_size=RING, create=True)
    try:
        for i in range(3):
            bus.publish(CH, i)

        def killed() -> None:
            writer = Bus(bus_name, keepalive_interval=0, create=True)
            writer.segment._kill_after_store(3)  # record, slot copy, slot version: killed before the commit
            writer.publish(CH, "lost")

        assert _in_child(killed) == -signal.SIGKILL
        code = (
            "import shmbus, sys\n"
            f"b = shmbus.Bus({bus_name!r}, keepalive_interval=0, create=True)\n"
            f"assert b.last_id({CH!r}) == 3, b.last_id({CH!r})\n"
            f"assert [m.data for m in b.backlog({CH!r})] == [0, 1, 2]\n"
            f"assert b.publish({CH!r}, 'next') == 4\n"
            "assert [m.global_id for m in b.global_backlog()] == [1, 2, 3, 4]\n"
            "assert b.stats().repairs == 1\n"
            "b.close()\n"
        )
        subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    finally:
        bus.destroy()
