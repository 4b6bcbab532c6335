"""Electing the one sender: a tiny interface (:class:`Elector`) over a lock that dies with its holder.

Why a lock the system releases: the sender must be exactly one process, and a SIGKILLed sender must be replaced
without anyone declaring it dead. On one host that is a ``flock`` on a file (:class:`FileElector`: the kernel drops
it with the holder's last descriptor); across hosts, a PostgreSQL session advisory lock
(:class:`~shmbus.adapters.push.pgstore.PostgresElector`: the server drops it with the holder's session). The same
primitives elect the bridges' relays; this interface is all the connector needs, so another elector (a shared
"bridge kit") can replace these without touching the sender.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from typing import Protocol

from shmbus.perprocess import Birth

__all__ = ["Elector", "FileElector"]


class Elector(Protocol):
    """``try_acquire()`` without blocking; ``held()`` is checked before each batch and must turn False when the
    lock may have been lost (a dropped session); ``release()`` gives it up (also called after a loss)."""

    def try_acquire(self) -> bool: ...

    def held(self) -> bool: ...

    def release(self) -> None: ...


class FileElector:
    """One sender per host: an exclusive ``flock`` on ``path``, taken on a descriptor opened by the caller
    (never inherited: ``O_CLOEXEC``, and a forked child closes its copy, so it cannot keep the lock alive)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self._birth = Birth()

    def try_acquire(self) -> bool:
        self._forget_inherited()
        if self._fd is not None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def held(self) -> bool:
        self._forget_inherited()
        return self._fd is not None

    def release(self) -> None:
        self._forget_inherited()
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def _forget_inherited(self) -> None:
        if not self._birth.here:  # forked: the parent's description is not ours to hold
            self._birth.renew()
            if self._fd is not None:
                fd, self._fd = self._fd, None
                with contextlib.suppress(OSError):
                    os.close(fd)
