"""An exception raised anywhere in a writer (a signal handler's: SIGALRM timeouts, Celery's soft time limit, Ctrl-C;
an async exception in a thread) never leaves the segment's lock held, nor a torn bus, and a publish it stops happened
once or not at all.

The deterministic tests inject one exception at each place in shmbus's code where CPython may raise one (a function's
start, after each call, at each backward jump: where it checks its "eval breaker"), in turn, until the operation
completes without reaching the n-th place. The stress test sends real signals to a publishing process.
"""

from __future__ import annotations

import ctypes
import dis
import errno
import functools
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

import pytest

from shmbus import Bus, _native
from shmbus.segment import Segment
from shmbus.segment.layout import _Q_REPAIR_DUE, REPAIR_DUE

CH = "/interrupted"
_FUTEX_OWNER_DIED = 0x40000000  # the bit the kernel sets in a robust mutex's word when its owner thread ends


class Injected(BaseException):
    """What the test raises: a BaseException, like KeyboardInterrupt, so no ``except Exception`` swallows it."""


#: The instructions after which CPython looks at its "eval breaker", where it runs a signal handler (and raises
#: what it raises) or raises a thread's async exception: a call (when it returns), a backward jump; and a function's
#: start (its "call" trace event). Nowhere else can such an exception land.
_BREAKER_CHECKED_AFTER = frozenset(
    {
        "CALL",
        "CALL_FUNCTION_EX",
        "CALL_KW",
        "JUMP_BACKWARD",
        "POP_JUMP_BACKWARD_IF_FALSE",
        "POP_JUMP_BACKWARD_IF_TRUE",
        "POP_JUMP_BACKWARD_IF_NONE",
        "POP_JUMP_BACKWARD_IF_NOT_NONE",
    }
)


@functools.cache
def _opnames(code: CodeType) -> dict[int, str]:
    return {ins.offset: ins.opname for ins in dis.get_instructions(code)}


def run_injected(action: Callable[[], object], n: int, *, locked: Segment | None = None) -> bool:
    """Run ``action``, raising :class:`Injected` at the ``n``-th place in shmbus's code where CPython may raise a
    signal handler's or an async exception; True if it did. With ``locked``, count only the places from the call of
    its ``_lock`` until this thread no longer holds its lock (for an operation whose lock-free part is long)."""
    count = 0
    injected = False
    last_offset: dict[FrameType, int] = {}
    counting, held = locked is None, False

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count, injected, counting, held
        if locked is not None:
            if event == "call" and frame.f_code.co_name == "_lock":
                counting = True
            elif counting and _native.mutex_held(locked._mutex_ptr):
                held = True
            elif held:  # taken, then released: the rest is lock-free
                counting = held = False
            if not counting:
                return local
        if event == "opcode":
            previous = last_offset.get(frame)
            last_offset[frame] = frame.f_lasti
            if previous is None or _opnames(frame.f_code).get(previous) not in _BREAKER_CHECKED_AFTER:
                return local
        elif event != "call":
            return local
        count += 1
        if count == n:
            injected = True
            raise Injected  # CPython turns tracing off and raises it in the frame
        return local

    def on_call(frame: FrameType, event: str, arg: Any) -> Any:
        if not str(frame.f_globals.get("__name__", "")).startswith("shmbus"):
            return None
        frame.f_trace_opcodes = True
        return local(frame, event, arg)

    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        action()
    except Injected:
        pass
    finally:
        sys.settrace(previous)
    return injected


def lock_is_free(seg: Segment) -> bool:
    """Can another thread take the lock at once? (and this one holds it not)"""
    codes: list[int] = []

    def probe() -> None:
        rc = _native._trylock(seg._mutex_ptr)
        if rc == errno.EOWNERDEAD:  # free too, from a dead owner: leave its repair to the next holder
            _native._consistent(seg._mutex_ptr)
            seg._u64[_Q_REPAIR_DUE] |= REPAIR_DUE
        if rc in (0, errno.EOWNERDEAD):
            _native.mutex_unlock(seg._mutex_ptr)
        codes.append(rc)

    thread = threading.Thread(target=probe)
    thread.start()
    thread.join()
    return codes[0] in (0, errno.EOWNERDEAD) and not _native.mutex_held(seg._mutex_ptr)


def committed(seg: Segment) -> dict[int, bytes]:
    """Every committed record still in the ring, global id -> payload (read lock-free, as any reader would)."""
    return {r.global_id: r.payload for r in seg.read_since(0, limit=1 << 20)[0]}


def check_once_or_not(before: dict[int, bytes], now: dict[int, bytes], payload: bytes) -> None:
    """``now`` is ``before`` (less what the ring overwrote), plus at most the one new record, with the next id."""
    assert list(now) == list(range(min(now), max(now) + 1)) if now else True, "global ids not contiguous"
    for gid, data in now.items():
        if gid in before:
            assert data == before[gid], f"record {gid} changed"
        else:
            assert gid == max(before, default=0) + 1 and data == payload, f"record {gid} is not the new one: {data!r}"
    if now and before:
        assert all(now.get(gid) == before[gid] for gid in before if gid >= min(now)), "a record vanished"


def die_holding_the_lock(seg: Segment) -> None:
    """A thread that takes the lock and ends: the kernel marks the robust mutex's owner dead (EOWNERDEAD)."""
    thread = threading.Thread(target=_native.mutex_lock, args=(seg._mutex_ptr, 5.0))
    thread.start()
    thread.join()  # returns before the thread's exit reaches the kernel: wait for the kernel's mark
    word = ctypes.c_uint32.from_address(seg._mutex_ptr.value or 0)
    while not word.value & _FUTEX_OWNER_DIED:
        time.sleep(0.0001)


def leave_a_repair_due(seg: Segment) -> None:
    """What an interrupted holder leaves behind (here with nothing torn)."""
    try:
        seg._lock()
        seg._u64[_Q_REPAIR_DUE] |= REPAIR_DUE
    finally:
        seg._unlock()


SETUPS: dict[str, Callable[[Segment], None]] = {
    "plain": lambda seg: None,
    "owner-died": die_holding_the_lock,
    "repair-due": leave_a_repair_due,
}

#: The shapes of append (as in test_kill_points): bus options, then the channel and the data of the n-th publish.
SHAPES: dict[str, tuple[dict[str, Any], Callable[[int], str], Callable[[int], str]]] = {
    "known-channel": ({}, lambda n: CH, lambda n: f"m{n}"),
    # a 64 KiB ring of 1 KiB records: tail advances, a pad at the ring's end now and then
    "full-ring": ({"ring_size": 64 << 10}, lambda n: CH, lambda n: f"m{n}".ljust(1000, "x")),
    # and every publish on a new channel: each a first publish, in a table of 16 that evicts channels
    "new-channels": ({"ring_size": 64 << 10}, lambda n: f"/c{n}", lambda n: f"m{n}".ljust(1000, "x")),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("setup", sorted(SETUPS))
def test_an_exception_anywhere_in_a_publish_leaves_the_lock_free_and_the_bus_whole(
    setup: str, shape: str, make_bus: Callable[..., Bus]
) -> None:
    options, channel_of, data_of = SHAPES[shape]
    bus = make_bus(max_channels=16, **options)
    seg = bus.segment
    for i in range(100):  # fill the ring (in the small ones), and the table with channels whose messages are gone
        bus.publish(f"/old{i % 12}", "x" * 900)
    bus.publish(CH, "first")  # the channel's key is cached from now on: every run takes the same path
    before = committed(seg)
    on_channel = {CH: 1}  # messages committed per channel
    stopped = 0
    n = 0
    while True:
        n += 1
        assert n < 5000, "the publish path never completed"
        SETUPS[setup](seg)
        channel, data = channel_of(n), data_of(n)
        injected = run_injected(lambda: bus.publish(channel, data), n)  # noqa: B023 - called at once
        assert lock_is_free(seg), f"exception at event {n}: the lock is still held"
        now = committed(seg)
        check_once_or_not(before, now, f'"{data}"'.encode())
        if max(now) > max(before):  # the publish happened
            on_channel[channel] = on_channel.get(channel, 0) + 1
        # the channel's state (read lock-free, as before any repair) names what the ring holds: no id skipped
        assert bus.last_id(channel) == on_channel.get(channel, 0), f"exception at place {n}"
        ids = [m.message_id for m in bus.backlog(channel)]
        assert ids == list(range(ids[0], on_channel[channel] + 1)) if ids else True, f"exception at place {n}: {ids}"
        before = now
        if not injected:
            break
        stopped += 1
    assert stopped > 20, f"only {stopped} places: the injection does not see the publish path"
    # the next publish repairs whatever is left and continues every id
    last = bus.last_id(CH)
    assert bus.publish(CH, "after") == last + 1
    assert [m.data for m in bus.backlog(CH)][-1] == "after"
    now = committed(seg)
    check_once_or_not(before, now, b'"after"')
    assert seg.global_id() == max(now)
    assert not seg._u64[_Q_REPAIR_DUE]


def test_an_exception_anywhere_in_a_publish_in_a_thread_leaves_the_lock_free(make_bus: Callable[..., Bus]) -> None:
    """PyThreadState_SetAsyncExc raises in a thread where a signal handler raises in the main thread."""
    bus = make_bus(max_channels=16)  # a short repair: every place in it is tried
    seg = bus.segment
    bus.publish(CH, 0)  # the channel's key is cached from now on: every run takes the same path
    held: list[int] = []
    ends: list[int] = []

    def publishing_thread() -> None:
        n = 0
        while run_injected(lambda: bus.publish(CH, n), n := n + 1):
            if not lock_is_free(seg):
                held.append(n)
        ends.append(n)

    thread = threading.Thread(target=publishing_thread)
    thread.start()
    thread.join()
    assert ends and ends[0] > 20 and not held, (ends, held)
    records = committed(seg)
    assert list(records) == list(range(1, len(records) + 1))
    assert bus.publish(CH, "after") == len(records) + 1


def test_an_exception_anywhere_in_a_reset_finishes_it_or_leaves_the_bus_as_it_was(make_bus: Callable[..., Bus]) -> None:
    bus = make_bus(max_channels=16)  # a short repair: every place in it is tried
    seg = bus.segment
    n = 0
    while True:
        n += 1
        assert n < 2000, "the reset never completed"
        for i in range(3):
            bus.publish(CH, i)
        before = list(committed(seg).values())
        injected = run_injected(bus.reset, n)
        assert lock_is_free(seg), f"exception at event {n}: the lock is still held"
        # the next holder finishes a reset that was under way; one that had not begun leaves the bus as it was
        message_id = bus.publish(CH, "after")
        after = committed(seg)
        if message_id == 1:
            assert list(after.values()) == [b'"after"'], f"exception at place {n}: {after}"
        else:
            assert message_id == len(before) + 1, f"exception at place {n}: id {message_id}"
            assert list(after.values()) == [*before, b'"after"'], f"exception at place {n}: {after}"
        assert list(after) == list(range(1, len(after) + 1))
        assert [m.message_id for m in bus.backlog(CH)] == list(range(1, message_id + 1))
        if not injected:
            break
        bus.reset()


@pytest.mark.parametrize("operation", ["stats", "attach", "count_published", "break_chains", "wake_all", "wait"])
def test_an_exception_anywhere_under_the_lock_leaves_it_free(operation: str, make_bus: Callable[..., Bus]) -> None:
    bus = make_bus(max_channels=16)  # a short repair: every place in it is tried
    seg = bus.segment
    bus.publish(CH, "first")
    opened: list[Segment] = []
    actions: dict[str, Callable[[], object]] = {
        "stats": seg.stats,
        "attach": lambda: opened.append(Segment.open(seg.name, create=False)),
        "count_published": seg.count_published,
        "break_chains": seg.break_chains,
        "wake_all": seg.wake_all,
        # a listener about to sleep counts itself under the lock (each time: as if the word had moved since)
        "wait": lambda: (setattr(seg, "_counted_for", None), seg.wait(seg.futex_word(), 0.001)),
    }
    n = 0
    while run_injected(actions[operation], n := n + 1, locked=seg):
        assert lock_is_free(seg), f"exception at event {n}: the lock is still held"
        assert n < 5000
    assert n > 5
    for other in opened:
        other.close()
    assert bus.publish(CH, "after") == 2


def test_real_signals_raising_in_a_publish_loop_leave_the_lock_free(make_bus: Callable[..., Bus]) -> None:
    """A SIGALRM handler that raises, on a tiny interval timer, in a process that publishes in a loop."""
    bus = make_bus(ring_size=8 << 20, max_backlog_size=100_000)
    bus.publish(CH, -1)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 1
        try:
            os.close(r)
            code = _publish_under_alarms(Bus(bus.segment.name, keepalive_interval=0, max_backlog_size=100_000), w)
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as pipe:
        report = pipe.read().decode().split()
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    interrupted, done = int(report[0]), {int(x) for x in report[1:]}
    assert interrupted >= 20, f"only {interrupted} publishes were interrupted: the test proves little"
    # the lock is free (this would raise BusLockTimeout), every id continues, every completed publish is there once
    last = bus.last_id(CH)
    assert bus.publish(CH, "after") == last + 1
    seen = [m.data for m in bus.backlog(CH)]
    assert seen[0] == -1 and seen[-1] == "after"
    numbers = seen[1:-1]
    assert len(numbers) == len(set(numbers)) and numbers == sorted(numbers)
    assert done <= set(numbers), sorted(done - set(numbers))[:5]
    records = committed(bus.segment)
    assert list(records) == list(range(1, len(records) + 1))


class Alarm(BaseException):
    pass


def _publish_under_alarms(bus: Bus, out: int) -> int:
    """Publish 0, 1, 2, ... while SIGALRM raises every 200 us; report the interruptions and the publishes done."""
    armed = [False]

    def on_alarm(signum: int, frame: object) -> None:
        if armed[0]:
            raise Alarm

    signal.signal(signal.SIGALRM, on_alarm)
    done: list[int] = []
    interrupted = 0
    signal.setitimer(signal.ITIMER_REAL, 0.0002, 0.0002)
    try:
        for i in range(50_000):
            if interrupted >= 300:
                break
            try:
                armed[0] = True
                bus.publish(CH, i)
                armed[0] = False
                done.append(i)
            except Alarm:
                armed[0] = False
                interrupted += 1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
    if _native.mutex_held(bus.segment._mutex_ptr):
        return 3
    os.write(out, " ".join(map(str, [interrupted, *done])).encode())
    os.close(out)
    return 0
