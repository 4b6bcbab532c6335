"""shmbus's own threads (a bus's listener, the client's loop) leave asynchronous signals to the main thread.

Linux delivers a signal sent to a process (Ctrl-C's SIGINT, a supervisor's SIGTERM) to any one of its threads
that does not block it. CPython runs the Python handler only in the main thread, and a main thread blocked in a
wait without a timeout (``queue.get()``, ``Event.wait()``, ``signal.pause()``) is woken only if the signal
interrupts *its* system call: delivered to one of our threads instead, Ctrl-C was noted and never acted upon
(seen: ``shmbus listen`` still running a minute after SIGINT on a loaded machine). A thread that blocks these
signals is never chosen, so the main thread gets them. The mask is set by the starting thread around ``start()``
(a new thread inherits it), so no signal can land in the new thread before it is blocked there; one arriving
meanwhile waits, pending, until the starting thread unblocks it.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

__all__ = ["ASYNC_SIGNALS", "start_without_signals"]

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
