"""Segments a hostile or careless neighbour could leave in /dev/shm, and lock holders that never let go.

Each test plants or damages a segment the way an attacker (another local user) or a crash could, and checks that
attaching or reading gives a typed error that says what is wrong: never a raw ``struct.error``, a hang, a loop,
a silent re-initialisation or a silent stop of live delivery.
"""

from __future__ import annotations

import os
import platform
import signal
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import shmbus
from shmbus import Bus, _native
from shmbus.segment import Segment, layout, segment_path
from tests.harness.wait import wait_for


def _run_bounded(fn: Callable[[], Any], seconds: float = 20.0) -> Any:
    """Call ``fn`` in a thread; fail (instead of hanging the suite) if it does not return in time."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = fn()
        except BaseException as exc:
            result["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{fn} did not return within {seconds} s (a loop or a hang)"
    if "error" in result:
        raise result["error"]
    return result.get("value")


# ------------------------------------------------------------------ who may have made the file
@pytest.mark.skipif(os.geteuid() != 0, reason="planting a file owned by another user needs root")
def test_a_segment_owned_by_another_user_is_refused(bus_name: str) -> None:
    bus = Bus(bus_name, ring_size=1 << 20, keepalive_interval=0, create=True)
    bus.publish("/x", 1)
    path = bus.segment.path
    try:
        os.chown(path, 65534, 65534)  # as if user "nobody" had created it first, to read and inject
        with pytest.raises(shmbus.UnsafeSegment, match=r"belongs to \S+ \(uid 65534\)"):
            Bus(bus_name, keepalive_interval=0, create=True).last_id("/x")
    finally:
        bus.destroy()


@pytest.mark.parametrize(
    ("file_mode", "allowed", "refused"),
    [
        (0o666, 0o600, "other users write"),
        (0o644, 0o600, "other users read"),
        (0o660, 0o600, "its group write"),
        (0o660, 0o660, None),  # the caller opted in to sharing with the group
    ],
)
def test_segment_permissions_beyond_the_callers_mode_are_refused(
    bus_name: str, file_mode: int, allowed: int, refused: str | None
) -> None:
    bus = Bus(bus_name, ring_size=1 << 20, keepalive_interval=0, create=True)
    bus.publish("/x", 1)
    try:
        os.chmod(bus.segment.path, file_mode)
        if refused:
            with pytest.raises(shmbus.UnsafeSegment, match=refused):
                Segment.open(bus_name, mode=allowed)
        else:
            seg = Segment.open(bus_name, mode=allowed)
            assert seg.last_id(b"/x") == 1
            seg.close()
    finally:
        bus.destroy()


def test_new_segments_get_exactly_the_requested_mode_whatever_the_umask(bus_name: str) -> None:
    old = os.umask(0o077)
    try:
        seg = Segment.open(bus_name, ring_size=1 << 20, mode=0o660)
    finally:
        os.umask(old)
    try:
        assert os.stat(seg.path).st_mode & 0o777 == 0o660
    finally:
        seg.unlink()
        seg.close()


def test_a_zero_length_file_is_refused_and_left_alone(bus_name: str) -> None:
    path = segment_path(bus_name)
    with open(path, "wb"):
        pass
    os.chmod(path, 0o600)
    try:
        with pytest.raises(shmbus.NotASegment, match="empty"):
            Bus(bus_name, keepalive_interval=0, create=True).publish("/x", 1)
        assert os.path.getsize(path) == 0  # never silently re-initialised
    finally:
        os.unlink(path)


def test_racing_creators_all_attach_to_one_fully_initialised_segment(bus_name: str) -> None:
    """Creation happens under a temporary name, linked into place once whole: no one sees a half-made segment."""
    r, w = os.pipe()
    children = []
    go = time.time() + 0.5
    for _ in range(6):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            code = 1
            try:
                time.sleep(max(go - time.time(), 0))
                seg = Segment.open(bus_name, ring_size=1 << 20)
                os.write(w, f"{seg.epoch}\n".encode())
                seg.close()
                code = 0
            finally:
                os._exit(code)
        children.append(pid)
    os.close(w)
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
    with os.fdopen(r) as f:
        epochs = f.read().split()
    try:
        assert codes == [0] * 6
        assert len(epochs) == 6 and len(set(epochs)) == 1, epochs
        leftovers = [n for n in os.listdir("/dev/shm") if n.startswith(f"shmbus.{bus_name}.")]
        assert leftovers == []  # no temporary file left behind by the losers
    finally:
        Segment.destroy_by_name(bus_name)


# ------------------------------------------------------------------ damaged contents
def _plant(bus_name: str, offset: int, fmt: str, value: Any) -> None:
    bus = Bus(bus_name, ring_size=1 << 20, keepalive_interval=0, create=True)
    bus.publish("/x", 1)
    struct.pack_into(fmt, bus.segment.mm, offset, value)
    bus.close()


@pytest.mark.parametrize(
    ("offset", "fmt", "value", "what"),
    [
        (40, "<Q", 0, "ring size 0"),  # used to raise ZeroDivisionError
        (40, "<Q", 12345, "ring size"),
        (56, "<I", 0, "slots"),
        (48, "<Q", 1 << 40, "channel table"),
        (16, "<Q", 0, "epoch"),
    ],
)
def test_a_damaged_header_is_refused_with_a_typed_error(
    bus_name: str, offset: int, fmt: str, value: int, what: str
) -> None:
    _plant(bus_name, offset, fmt, value)
    try:
        with pytest.raises(shmbus.SegmentCorrupt, match=what):
            Bus(bus_name, keepalive_interval=0, create=True).last_id("/x")
    finally:
        Segment.destroy_by_name(bus_name)


@pytest.mark.parametrize(("head", "tail"), [(16, 4096), (17, 0), (1 << 40, 0)])
def test_an_impossible_commit_state_is_refused_on_attach(bus_name: str, head: int, tail: int) -> None:
    """head < tail, a misaligned head or more than a ring of history used to stop live delivery silently."""
    bus = Bus(bus_name, ring_size=1 << 20, keepalive_interval=0, create=True)
    bus.publish("/x", 1)
    struct.pack_into("<Q", bus.segment.mm, layout._OFF_HEAD, head)
    struct.pack_into("<Q", bus.segment.mm, layout._OFF_TAIL, tail)
    bus.close()
    try:
        with pytest.raises(shmbus.SegmentCorrupt, match="commit state"):
            Bus(bus_name, keepalive_interval=0, create=True).publish("/x", 2)
    finally:
        Segment.destroy_by_name(bus_name)


def test_a_record_chain_that_points_at_itself_raises_instead_of_looping(make_bus: Any) -> None:
    bus = make_bus(ring_size=1 << 20)
    for i in range(3):
        bus.publish("/loop", i)
    seg = bus.segment
    _, newest, _, _ = seg.channel_state(b"/loop")
    pos = newest - 1
    struct.pack_into("<Q", seg.mm, seg.ring_off + pos % seg.ring_size + 24, pos + 1)  # prev = itself
    with pytest.raises(shmbus.SegmentCorrupt, match="chain broken"):
        _run_bounded(lambda: bus.backlog("/loop"))


def test_a_garbage_record_raises_typed_errors_and_live_delivery_goes_on(make_bus: Any) -> None:
    bus = make_bus(ring_size=1 << 20)
    got: list[Any] = []
    arrived = threading.Event()

    def on_message(msg: Any) -> None:
        got.append(msg.data)
        if msg.data == "after":
            arrived.set()

    bus.subscribe("/live", on_message)
    bus.publish("/live", "before")
    wait_for(lambda: got == ["before"], what="the listener running")
    seg = bus.segment
    writer = Bus(bus.name, keepalive_interval=0, create=True)  # another handle: its publishes land after the damage
    head = seg.head()
    writer.publish("/live", "damaged")
    struct.pack_into("<I", seg.mm, seg.ring_off + head % seg.ring_size, 7)  # record length 7: impossible
    with pytest.raises(shmbus.SegmentCorrupt, match="length 7"):
        _run_bounded(lambda: bus.global_backlog())
    # the listener has met the damage (or read the record before it was damaged): only then publish, so what is
    # checked is delivery after the damage, not how late a loaded machine woke the listener
    wait_for(lambda: "damaged" in got or bus.health()["lost_by_listener"] >= 1, what="the listener past the damage")
    writer.publish("/live", "after")
    assert arrived.wait(10), f"live delivery stopped after the damaged record: {got}"
    # The listener either read "damaged" before it was damaged, or met the damage: then it skipped it and
    # counted it lost. Either way nothing vanished silently.
    assert "damaged" in got or bus.health()["lost_by_listener"] >= 1, (got, bus.health())
    writer.close()


# ------------------------------------------------------------------ a lock holder that never lets go
@pytest.mark.parametrize("spin", [0, 20])
def test_a_stopped_lock_holder_gives_bounded_waits_naming_it(
    spin: int, bus_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_native, "LOCK_SPIN", spin)  # a bounded spin before the sleep changes none of it
    seg = Segment.open(bus_name, ring_size=1 << 20)
    seg.append(b"/x", b"", b"1")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child: take the writer lock, then freeze
        holder = Segment.open(bus_name)
        holder._lock()
        os.write(w, b"locked")
        os.kill(os.getpid(), signal.SIGSTOP)
        os._exit(0)
    try:
        assert os.read(r, 6) == b"locked"
        seg.lock_timeout = 0.3
        with pytest.raises(shmbus.BusLockTimeout, match=f"held by pid {pid}") as info:
            _run_bounded(lambda: seg.append(b"/x", b"", b"2"))
        assert info.value.holder_pid == pid
        with pytest.raises(shmbus.BusLockTimeout):  # attaching registers the process: bounded too
            _run_bounded(lambda: Segment.open(bus_name, lock_timeout=0.3))
        assert seg.last_id(b"/x") == 1  # lock-free reads are unaffected
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(r)
        os.close(w)
    assert seg.append(b"/x", b"", b"3") == (2, 2)  # the holder died: EOWNERDEAD, repaired, nothing lost
    seg.unlink()
    seg.close()


def test_other_architectures_are_refused_not_trusted(monkeypatch: pytest.MonkeyPatch, bus_name: str) -> None:
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    with pytest.raises(shmbus.UnsupportedPlatform, match="x86-64"):
        Segment.open(bus_name)
    assert not os.path.exists(segment_path(bus_name))
