"""shmbus.perprocess: a per-process value is rebuilt in a forked child and never handed over."""

from __future__ import annotations

import os
import threading

from shmbus.perprocess import Birth, PerProcess, generation


def _in_child(body: object) -> int:
    """Run ``body()`` in a forked child; its return value (a small int) is the exit status."""
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            code = body()  # type: ignore[operator]
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_value_is_made_once_per_process_and_again_after_a_fork() -> None:
    made: list[int] = []
    holder = PerProcess(lambda: made.append(os.getpid()) or object())
    first = holder.get()
    assert holder.get() is first and holder.current() is first and len(made) == 1

    def child() -> int:
        if holder.current() is not None:
            return 1  # the parent's value leaked into the child
        mine = holder.get()
        return 0 if mine is not first and made[-1] == os.getpid() and holder.get() is mine else 2

    assert _in_child(child) == 0
    assert holder.get() is first  # the parent keeps its own


def test_a_lock_held_by_a_parent_thread_at_fork_does_not_block_the_child() -> None:
    entered, release = threading.Event(), threading.Event()

    def slow() -> object:
        entered.set()
        release.wait(5)
        return object()

    holder: PerProcess[object] = PerProcess(slow)
    t = threading.Thread(target=holder.get)
    t.start()
    entered.wait(5)  # the thread holds the holder's lock now
    try:
        holder_in_child = PerProcess(object)  # noqa: F841 (another instance: renewed too)
        assert _in_child(lambda: 0 if holder.current() is None and holder.clear() is None else 3) == 0
    finally:
        release.set()
        t.join()


def test_clear_returns_only_this_process_value() -> None:
    holder = PerProcess(object)
    value = holder.get()
    assert _in_child(lambda: 0 if holder.clear() is None else 4) == 0
    assert holder.clear() is value and holder.current() is None


def test_birth_is_here_only_in_the_process_that_made_it() -> None:
    birth = Birth()
    before = generation()
    assert birth.here and birth.pid == os.getpid()

    def child() -> int:
        if birth.here or generation() != before + 1:
            return 5
        birth.renew()
        return 0 if birth.here and birth.pid == os.getpid() else 6

    assert _in_child(child) == 0
    assert birth.here
