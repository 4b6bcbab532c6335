"""The relay election: one process per host holds an OFD byte-range lock on the bus's segment file.

The lock is taken on a file descriptor each process opens itself (after fork), so the kernel releases it when the
holder dies. The functions need no backend client, so ``shmbus stats`` can ask who holds it without redis-py.
The same election, on a file of its own, elects Web Push's sender on one host (``push.election.FileElector``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import struct

from shmbus.perprocess import Birth
from shmbus.segment import segment_path

__all__ = ["RELAY_LOCK_OFFSET", "RelayElection", "relay_active", "relay_held_by_other", "relay_lock_op"]

#: Byte offset of the relay lock in the segment file ("relay" in ASCII); advisory, never touches data.
RELAY_LOCK_OFFSET = 0x72656C6179
_FLOCK = struct.Struct("hhqqi4x")  # struct flock on Linux x86-64/aarch64: 32 bytes


def relay_lock_op(fd: int, cmd: int, kind: int) -> bytes:
    """``fcntl`` on the relay lock's byte: ``cmd`` is F_OFD_SETLK/F_OFD_GETLK, ``kind`` F_WRLCK/F_UNLCK."""
    return fcntl.fcntl(fd, cmd, _FLOCK.pack(kind, os.SEEK_SET, RELAY_LOCK_OFFSET, 1, 0))


def relay_held_by_other(fd: int) -> bool:
    """True when another open file description holds the relay lock (F_OFD_GETLK; our own never conflicts)."""
    got = _FLOCK.unpack(relay_lock_op(fd, fcntl.F_OFD_GETLK, fcntl.F_WRLCK))
    return bool(got[0] != fcntl.F_UNLCK)


def relay_active(path_or_bus: str) -> bool:
    """Does a process hold the relay lock of this bus (a bus name or a segment path)? For ``shmbus stats``."""
    path = path_or_bus if path_or_bus.startswith("/") else segment_path(path_or_bus)
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        return relay_held_by_other(fd)
    finally:
        os.close(fd)


class RelayElection:
    """This process's side of the election for one file (a bus's segment, for its relay): its own lock descriptor
    (opened lazily, never shared across fork), taking and releasing the lock, and asking whether another process
    holds it. ``create``: open the file, creating it (mode 0600) when missing; a segment is never created here."""

    def __init__(self, path: str, *, create: bool = False) -> None:
        self.path = path
        self._flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        self._fd = -1
        self._birth = Birth()  # the descriptor is this process's; a child opens its own
        self.held = False

    def _ensure_fd(self) -> int:
        if self._fd < 0:
            self._fd = os.open(self.path, self._flags, 0o600)
        return self._fd

    def try_take(self) -> bool:
        """Take the lock if no other process holds it (never blocks)."""
        try:
            relay_lock_op(self._ensure_fd(), fcntl.F_OFD_SETLK, fcntl.F_WRLCK)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise
        self.held = True
        return True

    def release(self) -> None:
        if self.held and self._fd >= 0 and self._birth.here:
            with contextlib.suppress(OSError):
                relay_lock_op(self._fd, fcntl.F_OFD_SETLK, fcntl.F_UNLCK)
        self.held = False

    def running(self) -> bool:
        """Does some process of the host relay (this one included)?"""
        if self.held:
            return True
        try:
            return relay_held_by_other(self._ensure_fd())
        except OSError:
            return False

    def after_fork(self) -> None:
        """In the child: close our copy of the descriptor (the parent's lock lives on in its open file description)."""
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd, self.held = -1, False
        self._birth.renew()

    def close(self) -> None:
        self.release()
        if self._fd >= 0 and self._birth.here:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = -1
