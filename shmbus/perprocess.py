"""Objects that belong to one process: the one fork-aware helper for everything made lazily per process.

A socket, a thread, a lock file descriptor or a hub made in a gunicorn master must not be used by its forked
workers: the child makes its own on first use. Instead of comparing a saved ``os.getpid()`` in every class, code
holds a :class:`PerProcess` (a lazy value, rebuilt in a forked child) or a :class:`Birth` (was this made in the
current process?). Both compare a fork generation, a plain integer that ``os.register_at_fork`` bumps in every
child, so the check costs no system call on the hot path.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["Birth", "PerProcess", "generation"]

T = TypeVar("T")

_generation = 0
_instances: weakref.WeakSet[PerProcess[Any]] = weakref.WeakSet()


def _forked() -> None:
    global _generation
    _generation += 1
    for holder in list(_instances):  # the child has one thread now: a lock held by a parent's thread is renewed
        holder._lock = threading.Lock()


os.register_at_fork(after_in_child=_forked)


def generation() -> int:
    """How many forks lie between the first process and this one (0 in a process that never forked)."""
    return _generation


class Birth:
    """Where something was made: ``here`` is true only in that same process (false in every forked child)."""

    __slots__ = ("_generation", "pid")

    def __init__(self) -> None:
        self.renew()

    def renew(self) -> None:
        """Claim the owner for the current process (after rebuilding it in a child)."""
        self._generation = _generation
        self.pid = os.getpid()

    @property
    def here(self) -> bool:
        return self._generation == _generation


class PerProcess(Generic[T]):
    """``get()`` returns this process's value, made by ``factory()`` on first use, and made again after a fork.

    The parent's value is never handed to a child, nor closed by it (its sockets belong to the parent); a child
    just drops its reference. ``current()`` peeks without making one; ``clear()`` forgets this process's value
    and returns it (for closing).
    """

    def __init__(self, factory: Callable[[], T]) -> None:
        self._factory = factory
        self._value: T | None = None
        self._generation = -1
        self._lock = threading.Lock()
        _instances.add(self)

    def get(self) -> T:
        value = self._value
        if value is not None and self._generation == _generation:
            return value
        with self._lock:
            if self._value is None or self._generation != _generation:
                self._value, self._generation = self._factory(), _generation
            return self._value

    def current(self) -> T | None:
        """This process's value if it was made here, else ``None`` (never the parent's)."""
        return self._value if self._generation == _generation else None

    def clear(self) -> T | None:
        """Forget this process's value; return it when it was made here (the caller closes it)."""
        with self._lock:
            value = self.current()
            self._value, self._generation = None, -1
            return value
