"""An event loop whose thread holds a lock except while it waits in ``select`` (:func:`new_loop`,
:func:`held_outside_select`): the lean server's loop.

Why: the bus listener thread of the process hands each batch to the loop. Waking the loop for it costs a thread
switch (the self-pipe, ``epoll_wait`` returning) and a handoff of the interpreter lock, on every worker, for every
message; for a chat message to a few streams that was most of its CPU. A loop that is idle in ``select`` touches
nothing, so the listener may do the loop's work itself while it holds the loop's lock: the loop's thread, should
``select`` return meanwhile, waits for the lock before it runs anything. The listener only takes the lock without
waiting (a busy loop gets the batch the usual way) and only for work that schedules nothing on the loop (a small
fan-out: :meth:`~shmbus.adapters.fanout.LoopFanout.add`).
"""

from __future__ import annotations

import asyncio
import selectors
import threading
import weakref
from typing import Any

__all__ = ["held_outside_select", "new_loop"]

_LOCKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, threading.Lock] = weakref.WeakKeyDictionary()


class _HeldOutsideSelect(selectors.DefaultSelector):
    """A selector whose :attr:`lock` the loop's thread holds from its creation on, except inside :meth:`select`."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.lock.acquire()  # by the thread making the loop, which runs it

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        self.lock.release()
        try:
            return super().select(timeout)
        finally:
            self.lock.acquire()


def new_loop() -> asyncio.AbstractEventLoop:
    """A new selector event loop for the calling thread (which must run it), with its lock registered."""
    selector = _HeldOutsideSelect()
    loop = asyncio.SelectorEventLoop(selector)
    _LOCKS[loop] = selector.lock
    return loop


def held_outside_select(loop: Any) -> threading.Lock | None:
    """The lock ``loop``'s thread holds except while it waits in ``select`` (None: a loop not made by
    :func:`new_loop`, in debug mode, or closed)."""
    try:
        lock = _LOCKS.get(loop)
    except TypeError:  # not weak-referenceable (a test's fake loop)
        return None
    if lock is None or loop.get_debug() or loop.is_closed():
        return None
    return lock
