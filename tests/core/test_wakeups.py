"""Sleepers on the futex word, and the publishes that wake them (``Processes.wait``, the end of the append).

A sleeper counts itself under the lock, only while the word is still the one it read; the next publish that finds
the count non-zero wakes every sleeper and zeroes the count, both under the lock. So a woken sleeper takes no lock,
a burst of publishes costs one wake-up call per round of sleeps, and no wake-up is lost: whatever point a publish
comes at, the sleeper returns; a publish stopped before its wake-up call leaves the count for the next one.
Every wait here has a long timeout (30 s) and every check a shorter bound (10 s): a sleeper that returns within it
was woken, not timed out.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from shmbus import Bus, _native
from shmbus.segment import Segment
from shmbus.segment.layout import _I_SLEEPERS

from .test_interrupted_writers import run_injected

LONG = 30.0  # a sleeper's timeout
BOUND = 10.0  # how long a test waits for a sleeper that should be woken


def sleepers(seg: Segment) -> int:
    return int(seg._u32[_I_SLEEPERS])


def in_the_kernel(thread: threading.Thread, seg: Segment) -> bool:
    """Is ``thread`` in the futex wait on the segment's word? (its system call, and that call's first argument)"""
    try:
        with open(f"/proc/self/task/{thread.native_id}/syscall") as f:
            call = f.read().split()
    except OSError:
        return False
    return len(call) > 1 and call[0] == "202" and int(call[1], 16) == seg._futex_addr


def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + BOUND
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.001)


@pytest.fixture
def wake_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The futex wake-up calls made from now on (counted once made)."""
    calls: list[int] = []
    real = _native.futex_wake

    def counting(address: int) -> None:
        real(address)
        calls.append(address)

    monkeypatch.setattr(_native, "futex_wake", counting)
    yield calls


class Sleeper(threading.Thread):
    """A thread in ``seg.wait(word, LONG)``; ``returned`` is set when the wait ends."""

    def __init__(self, seg: Segment, word: int) -> None:
        super().__init__(daemon=True)
        self.seg, self.word, self.returned = seg, word, threading.Event()

    def run(self) -> None:
        self.seg.wait(self.word, LONG)
        self.returned.set()


def test_a_woken_sleeper_costs_one_wake_up_call_however_many_publishes_come_before_it_runs(
    make_bus: Callable[..., Bus], wake_calls: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sleeper is woken, and not yet running (here: held right after its kernel wait) while ten more publishes
    come: they find it no longer counted and make no wake-up call (it used to take itself off the count, under the
    lock, only once it ran: until then every publish made a call)."""
    bus = make_bus()
    seg = bus.segment
    bus.publish("/w", 0)
    real_wait = _native.futex_wait
    woken, go_on = threading.Event(), threading.Event()

    def wait_then_hold(address: int, expected: int, timeout: float | None) -> None:
        real_wait(address, expected, timeout)
        woken.set()
        go_on.wait(BOUND)

    monkeypatch.setattr(_native, "futex_wait", wait_then_hold)
    sleeper = Sleeper(seg, seg.futex_word())
    sleeper.start()
    until(lambda: sleepers(seg) == 1, "the sleeper never counted itself")
    bus.publish("/w", 1)
    assert woken.wait(BOUND), "the publish did not wake the sleeper"
    for i in range(10):
        bus.publish("/w", i)
    go_on.set()
    sleeper.join(BOUND)
    assert len(wake_calls) == 1 and sleepers(seg) == 0


@pytest.mark.parametrize("point", ["before its wait", "after it counted itself", "while it sleeps"])
def test_a_publish_at_any_point_of_a_wait_ends_it(
    point: str, make_bus: Callable[..., Bus], wake_calls: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interleavings of one sleeper and one publish: the publish comes after the sleeper read the word and
    before it calls ``wait`` (it must not count itself, or sleep), between counting itself and the kernel's wait
    (the kernel sees the new word), or while it is in the kernel (the publish wakes it). In each, the wait ends
    and the count is back to zero."""
    bus = make_bus()
    seg = bus.segment
    word = seg.futex_word()
    if point == "before its wait":
        bus.publish("/p", 1)
    elif point == "after it counted itself":
        real_wait = _native.futex_wait

        def publish_then_wait(address: int, expected: int, timeout: float | None) -> None:
            assert sleepers(seg) == 1
            bus.publish("/p", 1)  # from the sleeper's own thread: it does not hold the lock here
            real_wait(address, expected, timeout)

        monkeypatch.setattr(_native, "futex_wait", publish_then_wait)
    sleeper = Sleeper(seg, word)
    sleeper.start()
    if point == "while it sleeps":
        until(lambda: in_the_kernel(sleeper, seg), "the sleeper never slept")
        bus.publish("/p", 1)
    assert sleeper.returned.wait(BOUND), f"a publish {point} did not end the wait"
    assert sleepers(seg) == 0
    assert len(wake_calls) == (0 if point == "before its wait" else 1)


def test_every_sleeper_is_woken_by_one_call(make_bus: Callable[..., Bus], wake_calls: list[int]) -> None:
    """Two attachments of the bus (as two processes would be), each counted; one publish wakes both."""
    first = make_bus()
    segs = [first.segment]
    second = make_bus(create=False)
    segs.append(second.segment)
    word = segs[0].futex_word()
    threads = [Sleeper(seg, word) for seg in segs]
    for t in threads:
        t.start()
    until(lambda: all(in_the_kernel(t, seg) for t, seg in zip(threads, segs, strict=True)), "the sleepers never slept")
    first.publish("/two", 1)
    for t in threads:
        assert t.returned.wait(BOUND), "a sleeper was not woken"
    assert len(wake_calls) == 1 and sleepers(segs[0]) == 0


def test_a_sleeper_whose_wait_timed_out_waits_again_without_the_lock_and_is_woken(
    make_bus: Callable[..., Bus], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its count stays while the word is the same: the listener's next wait (every second on an idle bus) takes no
    lock, and the next publish still wakes it."""
    bus = make_bus()
    seg = bus.segment
    word = seg.futex_word()
    seg.wait(word, 0.01)  # times out, counted
    assert sleepers(seg) == 1
    locks: list[int] = []
    real_lock = seg._lock

    def counting_lock() -> None:
        locks.append(threading.get_ident())
        real_lock()

    monkeypatch.setattr(seg, "_lock", counting_lock)
    sleeper = Sleeper(seg, word)
    sleeper.start()
    until(lambda: in_the_kernel(sleeper, seg), "the sleeper never slept")
    assert sleepers(seg) == 1
    bus.publish("/t", 1)
    assert sleeper.returned.wait(BOUND), "the publish did not wake the sleeper"
    assert sleeper.ident not in locks and sleepers(seg) == 0


def test_a_publish_stopped_anywhere_wakes_the_sleeper_or_leaves_it_to_the_next(
    make_bus: Callable[..., Bus],
) -> None:
    """An exception (a signal handler's, an async exception) raised at each place of a publish where CPython may
    raise one, in turn, while a sleeper is in the kernel: either that publish woke the sleeper, or it left the
    sleeper counted, and the next publish wakes it. Were the count zeroed before the wake-up call, or the call made
    after the unlock (where an exception can skip it once the count is zeroed), the sleeper would wait out its
    timeout."""
    bus = make_bus(max_channels=16)  # short repairs: the stopped publishes leave one due
    seg = bus.segment
    bus.publish("/s", 0)  # the channel's key is cached from now on: every run takes the same path
    n = stopped = 0
    while True:
        n += 1
        assert n < 2000, "the publish never completed"
        sleeper = Sleeper(seg, seg.futex_word())
        sleeper.start()
        until(lambda: in_the_kernel(sleeper, seg), "the sleeper never slept")  # noqa: B023 - called at once
        injected = run_injected(lambda: bus.publish("/s", n), n)  # noqa: B023 - called at once
        if sleepers(seg):  # stopped before it woke the sleeper and took it off the count: the next one does
            bus.publish("/s", "next")
        assert sleeper.returned.wait(BOUND), f"exception at place {n}: the sleeper was not woken"
        sleeper.join(BOUND)
        if not injected:
            break
        stopped += 1
    assert stopped > 20, f"only {stopped} places: the injection does not see the publish path"
    assert sleepers(seg) == 0
