"""A signal sent to the process reaches the main thread, never the bus's listener thread.

Linux gives such a signal to any thread that does not block it, and CPython runs the Python handler only in the
main thread; a main thread waiting without a timeout (``Event().wait()``, ``signal.pause()``, ``queue.get()``)
is woken only when the signal interrupts its own wait. The listener and keepalive threads block them.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable

import pytest

from shmbus import Bus
from shmbus.threads import ASYNC_SIGNALS, start_without_signals
from tests.harness.procs import blocked_signals


def blocked(tid: int) -> set[int]:
    return blocked_signals(os.getpid(), tid)


def test_the_listener_and_keepalive_threads_block_process_signals(make_bus: Callable[..., Bus]) -> None:
    bus = make_bus(keepalive_interval=30)  # the keepalive watchdog starts with the listener
    got = threading.Event()
    bus.subscribe("/s", lambda m: got.set())
    bus.publish("/s", "x")
    assert got.wait(30)
    threads = [t for t in threading.enumerate() if t.name.startswith(("shmbus-listener", "shmbus-keepalive"))]
    assert {t.name.split("-")[1] for t in threads} == {"listener", "keepalive"}, [t.name for t in threads]
    for t in threads:
        assert t.native_id is not None
        assert {int(s) for s in ASYNC_SIGNALS} <= blocked(t.native_id), t.name
    assert signal.SIGINT not in blocked(threading.get_native_id())  # the caller's own mask is left as it was


def test_start_without_signals_leaves_the_starting_threads_mask_as_it_was() -> None:
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    seen: list[set[int]] = []
    t = threading.Thread(target=lambda: seen.append(blocked(threading.get_native_id())))
    start_without_signals(t)
    t.join(30)
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before
    assert {int(s) for s in ASYNC_SIGNALS} <= seen[0]


@pytest.mark.parametrize("sig", [signal.SIGSEGV, signal.SIGPIPE, signal.SIGBUS, signal.SIGFPE])
def test_a_threads_own_faults_are_never_blocked(sig: signal.Signals) -> None:
    assert sig not in ASYNC_SIGNALS
