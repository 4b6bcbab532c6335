"""Electing the one sender: a tiny interface (:class:`Elector`) over a lock that dies with its holder.

Why a lock the system releases: the sender must be exactly one process, and a SIGKILLed sender must be replaced
without anyone declaring it dead. On one host that is the bridge kit's relay election on a file of the sender's
own (:class:`FileElector`: the kernel drops the lock with the holder's descriptor); across hosts, a PostgreSQL
session advisory lock (:class:`~shmbus.adapters.push.pgstore.PostgresElector`: the server drops it with the
holder's session). The kit has no election across hosts (a relay is elected per host: each host fills its own
segment), while one push sender serves every host of a namespace, so this three-method interface stays: it is all
the connector needs of either.
"""

from __future__ import annotations

from typing import Protocol

from shmbus.perprocess import Birth

from ..bridge.election import RelayElection

__all__ = ["Elector", "FileElector"]


class Elector(Protocol):
    """``try_acquire()`` without blocking; ``held()`` is checked before each batch and must turn False when the
    lock may have been lost (a dropped session); ``release()`` gives it up (also called after a loss)."""

    def try_acquire(self) -> bool: ...

    def held(self) -> bool: ...

    def release(self) -> None: ...


class FileElector:
    """One sender per host: the bridge kit's election (:class:`~shmbus.adapters.bridge.election.RelayElection`: an
    OFD lock that dies with its holder's descriptor, opened by this process and never inherited) on ``path``,
    created if missing. A forked child forgets its parent's hold (and closes its copy, so it cannot keep the lock
    alive); ``release`` closes the descriptor."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._election = RelayElection(path, create=True)
        self._birth = Birth()

    def try_acquire(self) -> bool:
        self._forget_inherited()
        return self._election.held or self._election.try_take()

    def held(self) -> bool:
        self._forget_inherited()
        return self._election.held

    def release(self) -> None:
        self._forget_inherited()
        self._election.close()

    def _forget_inherited(self) -> None:
        if not self._birth.here:  # forked: the parent's description is not ours to hold
            self._birth.renew()
            self._election.after_fork()
