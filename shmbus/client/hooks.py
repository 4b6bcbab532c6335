"""The client's hooks: what the poll loop tells the application about the connection, and how a hook that
misbehaves is kept from hurting it.

A hook is a plain function or a coroutine function. It runs on the client's event loop (the sync client's
thread), called by the poll loop: a plain one inline, before the loop goes on (keep it short: it delays the next
poll, never a callback), a coroutine one as a task of its own in the client's task group, that the loop does not
wait for (``stop()`` cancels those still running). A hook that raises is logged (``shmbus.client``, with its
traceback) and counted in ``stats.hook_errors``; polling goes on as if it had returned.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from .outcomes import ClientStats
from .positions import Reset

__all__ = ["Hooks"]

log = logging.getLogger("shmbus.client")
Hook = Callable[..., Any]
#: ``spawn(fn, *args)``: run ``fn(*args)`` as a task of the client's run
Spawn = Callable[..., object]


class Hooks:
    """``on_connect()``: the first 200 answer since the start or since a failed poll (the server is reachable,
    the client is polling; the first after a failure means "reconnected"). ``on_error(error, retry_in)``: a poll
    failed (counted in ``stats.failures``); the next attempt is in ``retry_in`` seconds. ``on_reset(reset)``: a
    channel's ids start again (a :class:`~shmbus.client.Reset`; the channel is read again from 0).
    ``on_rate_limited(retry_after)``: a 429; the next poll is in ``retry_after`` seconds."""

    def __init__(
        self,
        stats: ClientStats,
        *,
        on_connect: Hook | None = None,
        on_error: Hook | None = None,
        on_reset: Hook | None = None,
        on_rate_limited: Hook | None = None,
    ) -> None:
        for name, hook in (
            ("on_connect", on_connect),
            ("on_error", on_error),
            ("on_reset", on_reset),
            ("on_rate_limited", on_rate_limited),
        ):
            if hook is not None and not callable(hook):
                raise TypeError(f"{name} must be callable, got {hook!r}")
        self._stats = stats
        self._on_connect = on_connect
        self._on_error = on_error
        self._on_reset = on_reset
        self._on_rate_limited = on_rate_limited
        self._spawn: Spawn | None = None

    def open(self, spawn: Spawn) -> None:
        """Where coroutine hooks run from now on: ``spawn``'s tasks (the client's task group, each run)."""
        self._spawn = spawn

    def connected(self) -> None:
        self._fire("on_connect", self._on_connect)

    def error(self, error: Exception, retry_in: float) -> None:
        self._fire("on_error", self._on_error, error, retry_in)

    def reset(self, reset: Reset) -> None:
        self._fire("on_reset", self._on_reset, reset)

    def rate_limited(self, retry_after: float) -> None:
        self._fire("on_rate_limited", self._on_rate_limited, retry_after)

    def _fire(self, name: str, hook: Hook | None, *args: Any) -> None:
        if hook is None:
            return
        try:
            result = hook(*args)
            if inspect.isawaitable(result):
                assert self._spawn is not None, "a coroutine hook fired before open()"
                self._spawn(self._await, name, hook, result)
        except Exception:
            self._failed(name, hook)

    async def _await(self, name: str, hook: Hook, result: Awaitable[Any]) -> None:
        try:
            await result
        except Exception:
            self._failed(name, hook)

    def _failed(self, name: str, hook: Hook) -> None:
        self._stats.hook_errors += 1
        log.exception("shmbus.client: hook %s %r failed", name, hook)
