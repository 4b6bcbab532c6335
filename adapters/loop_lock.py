"""An event loop whose thread holds a lock except while it waits in ``select`` (:func:`new_loop`,
:func:`held_outside_select`): the lean server's loop.

Why: the bus listener thread of the process hands each batch to the loop. Waking the loop for it costs a thread
switch (the self-pipe, ``epoll_wait`` returning) and a handoff of the interpreter lock, on every worker, for every
message; for a chat message to a few streams that was most of its CPU. A loop that is idle in ``select`` touches
nothing, so the listener may do the loop's work itself while it holds the loop's lock: the loop's thread, should
``select`` return meanwhile, waits for the lock before it runs anything. The listener only takes the lock without
waiting (a busy loop gets the batch the usual way) and only for work that schedules nothing on the loop (a small
fan-out: :meth:`~shmbus.adapters.fanout.LoopFanout.add`).

A loop that is busy (its thread outside ``select``) is given work by :func:`post`, without the self-pipe: the loop
takes what was posted at the start of its next ``select`` and runs it in that iteration. Writing the self-pipe
byte cost the listener a system call and the busy loop a second pass through ``epoll_wait`` to read it (and the
interpreter lock handed back and forth meanwhile): on the worker that publishes a chat message from its own route,
the listener finds its loop still answering the publish, every time.
"""

from __future__ import annotations

import asyncio
import selectors
import threading
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["held_outside_select", "new_loop", "post"]

_LOCKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, threading.Lock] = weakref.WeakKeyDictionary()


class _HeldOutsideSelect(selectors.DefaultSelector):
    """A selector whose :attr:`lock` the loop's thread holds from its creation on, except inside :meth:`select`;
    what another thread :meth:`post`-ed while the loop was outside ``select`` runs in the loop's next iteration."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.lock.acquire()  # by the thread making the loop, which runs it
        self.loop: asyncio.AbstractEventLoop | None = None
        self._posts = threading.Lock()
        self._posted: list[Callable[[], object]] = []
        self._waiting = False  # in a ``select`` that may block: a post could be left there unseen

    def post(self, fn: Callable[[], object]) -> bool:
        """Any thread: run ``fn`` on the loop before its next wait, if the loop is outside ``select`` (True);
        False: it may be waiting, wake it (``call_soon_threadsafe``)."""
        with self._posts:
            if self._waiting:
                return False
            self._posted.append(fn)
            return True

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        with self._posts:
            posted, self._posted = self._posted, []
            self._waiting = not posted and timeout != 0
        if posted:
            loop = self.loop
            assert loop is not None
            for fn in posted:
                loop.call_soon(fn)  # on the loop's thread, before the loop counts its ready callbacks
            timeout = 0
        self.lock.release()
        try:
            return super().select(timeout)
        finally:
            self.lock.acquire()
            if self._waiting:
                with self._posts:
                    self._waiting = False


def new_loop() -> asyncio.AbstractEventLoop:
    """A new selector event loop for the calling thread (which must run it), with its lock registered."""
    selector = _HeldOutsideSelect()
    loop = asyncio.SelectorEventLoop(selector)
    selector.loop = loop
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


def post(loop: Any, fn: Callable[[], object]) -> bool:
    """Run ``fn`` on ``loop`` before its next wait without waking it, when the loop is outside ``select`` (True);
    False: it may be waiting (or is not a loop made by :func:`new_loop`), wake it as usual."""
    if held_outside_select(loop) is None:
        return False
    selector: _HeldOutsideSelect = loop._selector
    return selector.post(fn)
