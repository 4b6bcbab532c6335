"""What the client's tasks share, on any event loop anyio runs on (asyncio, trio): a resettable :class:`Flag`, and
the record of one :class:`Run` of a client (its tasks, from ``start()`` to ``stop()``).

A run's tasks live in one task group inside the run's cancel scope: ``stop()`` cancels the scope and, unless it is
called from one of those tasks (a callback, a hook), waits for :attr:`Run.finished`. The group is the caller's
(``async with client:``, the form trio needs: its tasks may not outlive the block that made them) or, on asyncio,
one :meth:`Run.detach` makes in a task of its own (``start()`` / ``stop()``, the sync client's loop thread).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import httpx

__all__ = ["Flag", "Run", "on_asyncio"]

#: the runs' detached asyncio tasks: the loop keeps only weak references to tasks
_DETACHED: set[asyncio.Task[None]] = set()


class Flag:
    """An event that can be cleared (anyio's ``Event`` is set once: a cleared flag is a fresh one). Waiters of the
    old one wake when it is set, as asyncio's do after ``set(); clear()``. Made, set and waited on one loop."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    def set(self) -> None:
        self._event.set()

    def clear(self) -> None:
        if self._event.is_set():
            self._event = anyio.Event()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self) -> None:
        await self._event.wait()


def on_asyncio() -> bool:
    """Whether the caller is an asyncio task (not trio, nor trio's guest mode on an asyncio loop)."""
    try:
        return asyncio.current_task() is not None
    except RuntimeError:  # no running asyncio loop in this thread
        return False


class Run:
    """One run of a client: the scope its tasks run in, who they are, and what its end does."""

    def __init__(self, http: httpx.AsyncClient, own_http: bool) -> None:
        self.http = http
        #: close :attr:`http` at the end (the client made it)
        self.own_http = own_http
        #: save the positions at the end (the sync client saves them itself, in its caller's thread)
        self.save = True
        self.scope = anyio.CancelScope()
        #: set once every task has ended and the end (save, close) is done
        self.finished = anyio.Event()
        self._members: set[int] = set()

    def cancel(self, save: bool) -> None:
        self.save = save
        self.scope.cancel()

    def is_member(self) -> bool:
        """Whether the calling task is one of this run's (``stop()`` must then not wait for the run to end)."""
        return anyio.get_current_task().id in self._members

    async def member(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run ``fn(*args)`` as a task of this run (started in its group)."""
        self._members.add(anyio.get_current_task().id)
        await fn(*args)

    def detach(self, body: Callable[[Run], Awaitable[None]], name: str) -> None:
        """Run ``body(self)`` in an asyncio task of its own (``start()`` outside ``async with``)."""
        task: asyncio.Task[None] = asyncio.create_task(self.member(body, self), name=name)
        _DETACHED.add(task)
        task.add_done_callback(_DETACHED.discard)
