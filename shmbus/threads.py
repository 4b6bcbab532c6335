"""shmbus's own threads (a bus's listener, the client's loop) leave asynchronous signals to the main thread.

Linux delivers a signal sent to a process (Ctrl-C's SIGINT, a supervisor's SIGTERM) to any one of its threads
that does not block it. CPython runs the Python handler only in the main thread, and a main thread blocked in a
wait without a timeout (``queue.get()``, ``Event.wait()``, ``signal.pause()``) is woken only if the signal
interrupts *its* system call: delivered to one of our threads instead, Ctrl-C is noted and not acted upon until
the main thread next runs Python code. A thread that blocks these signals is never chosen, so the main thread gets
them. The mask is set by the starting thread around ``start()``
(a new thread inherits it), so no signal can land in the new thread before it is blocked there; one arriving
meanwhile waits, pending, until the starting thread unblocks it.
"""

from __future__ import annotations

import queue
import signal
import threading
import time
from typing import Any, TypeVar

__all__ = ["ASYNC_SIGNALS", "SIGNAL_CHECK", "interruptible_get", "start_without_signals"]

T = TypeVar("T")

#: The longest a main thread's wait on one of our queues sleeps before Python looks for a signal (seconds).
SIGNAL_CHECK = 0.5

#: Signals sent to the process as a whole, meant for the program's handlers (never a thread's own fault, like
#: SIGSEGV or SIGPIPE, which must stay with the thread that caused them).
ASYNC_SIGNALS = frozenset(
    {
        signal.SIGINT,
        signal.SIGTERM,
        signal.SIGHUP,
        signal.SIGQUIT,
        signal.SIGALRM,
        signal.SIGUSR1,
        signal.SIGUSR2,
        signal.SIGCHLD,
        signal.SIGWINCH,
    }
)


def start_without_signals(thread: threading.Thread | Any) -> None:
    """Start ``thread`` (anything with ``start()``: a gevent-proof native thread too) with :data:`ASYNC_SIGNALS`
    blocked in it and in every thread it starts."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, ASYNC_SIGNALS)
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def interruptible_get(q: queue.SimpleQueue[T] | queue.Queue[T], timeout: float | None = None) -> T:
    """``q.get(timeout=timeout)`` that a signal (Ctrl-C) always ends, within :data:`SIGNAL_CHECK`.

    A signal that arrives after Python last looked for one but before the wait is asleep (inside ``get`` itself)
    has had its C handler run, so the sleep is not interrupted, and an unbounded ``get`` never returns to let Python
    raise ``KeyboardInterrupt``. Waiting in slices gives Python that chance after each one. ``queue.Empty`` once
    ``timeout`` has passed.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = SIGNAL_CHECK if deadline is None else min(SIGNAL_CHECK, deadline - time.monotonic())
        if left <= 0:
            raise queue.Empty
        try:
            return q.get(timeout=left)
        except queue.Empty:
            pass
