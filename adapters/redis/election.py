"""The relay election: one process per host holds an OFD byte-range lock on the bus's segment file.

The lock is taken on a file descriptor each process opens itself (after fork), so the kernel releases it when the
holder dies. It lives here, apart from the bridge, so ``shmbus stats`` can ask who holds it without redis-py.
"""

from __future__ import annotations

import fcntl
import os
import struct

from shmbus.segment import segment_path

__all__ = ["RELAY_LOCK_OFFSET", "relay_active", "relay_held_by_other", "relay_lock_op"]

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
