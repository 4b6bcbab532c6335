"""Wake-ups deferred to the moment a bus listener thread goes idle (:func:`when_idle`).

A tap runs on the listener thread and usually ends by waking another thread (an event loop's
``call_soon_threadsafe``). Woken at once, that thread wants the interpreter lock while the listener still holds
it: the listener reads the ring again before it sleeps. Each such overlap is a handoff of the lock (futex calls and
context switches), and a chat message on a web worker paid several. Deferred until the listener has nothing left
to read, the woken thread finds the lock free. The listener runs what was deferred before every wait and after
every full batch (a burst never holds a wake-up back for more than one batch).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

__all__ = ["IdleCalls", "when_idle"]

log = logging.getLogger("shmbus")

_local = threading.local()


class IdleCalls:
    """The calls deferred on one listener thread (made by the thread itself, see :meth:`install`)."""

    __slots__ = ("calls",)

    def __init__(self) -> None:
        self.calls: list[Callable[[], object]] = []

    @classmethod
    def install(cls) -> IdleCalls:
        """Make this thread a listener thread: :func:`when_idle` defers to the returned object from now on."""
        idle = _local.idle = cls()
        return idle

    def run(self) -> None:
        """Run (and forget) what was deferred, oldest first; a failing call is logged, the others still run."""
        calls = self.calls
        if not calls:
            return
        self.calls = []
        for fn in calls:
            try:
                fn()
            except Exception:
                log.exception("shmbus: a deferred wake-up failed")


def when_idle(fn: Callable[[], object]) -> None:
    """Call ``fn`` when this bus listener thread is about to wait (or after its current full batch); on any other
    thread, now."""
    idle: IdleCalls | None = getattr(_local, "idle", None)
    if idle is None:
        fn()
    else:
        idle.calls.append(fn)
