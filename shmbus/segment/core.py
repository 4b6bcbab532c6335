"""``Segment``: create or attach a segment, detach, remove, reset, stats."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import mmap
import os
import secrets
import stat
import struct
import time

import posix_ipc

from .. import _native
from ..channels import check_bus_name
from ..errors import (
    BusNotFound,
    NotASegment,
)
from . import layout
from .layout import (
    _I_CHANNELS,
    _I_SLEEPERS,
    _OFF_BOOT,
    _OFF_FLAGS,
    _OFF_MUTEX,
    _OFF_PROCS,
    _OFF_READY,
    _Q_GID,
    _Q_HEAD,
    _Q_OVERWRITTEN,
    _Q_REPAIR_DUE,
    _Q_REPAIRS,
    _Q_TAIL,
    DEFAULT_LOCK_TIMEOUT,
    FLAG_METRICS,
    HEADER_SIZE,
    LAYOUT_VERSION,
    MAGIC,
    MAX_PROCS,
    METRICS_SIZE,
    MIN_RING,
    READY,
    RESET_DUE,
    SLOT_SIZE,
    Record,
    SegmentStats,
    _boot_id,
    _check_ownership,
    _reinitialize_after_reboot,
    _table_bytes,
    _validate_header,
    segment_path,
)
from .writing import Writing

# Struct objects are assigned, not imported by name: see the note on the formats in layout.py.
_H_STATIC, _U32 = layout._H_STATIC, layout._U32


class Segment(Writing):
    """One attached segment. Create or attach with :meth:`open`; all methods are thread-safe.

    Its parts are layers, one module each, each a class whose bases are the parts it uses (the list is in
    :mod:`.state`): this one adds opening, closing, reset and stats to :class:`~.writing.Writing`, which stands on
    all the others."""

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def open(
        cls,
        name: str,
        *,
        ring_size: int = 32 << 20,
        max_channels: int = 8192,
        codec_name: str = "json",
        path: str | None = None,
        create: bool = True,
        mode: int = 0o600,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    ) -> Segment:
        """Attach to segment ``name``, creating and initialising it if it does not exist yet.

        ``path`` maps a regular file instead (the log then survives restarts and, once written back, reboots).
        Sizes only apply when this call creates the segment; an existing segment keeps its own.

        A new segment is built under a temporary name and linked into place only once initialised, so no process
        ever attaches a half-made one. An existing segment is refused (:class:`~shmbus.errors.UnsafeSegment`)
        unless it belongs to this user (or root) and grants group/other nothing beyond ``mode`` (``0o600`` by
        default; ``0o660`` opts in to sharing with the file's group), and every header field is validated.
        """
        _native.require_supported()
        if isinstance(ring_size, bool) or not isinstance(ring_size, int) or ring_size < MIN_RING or ring_size % 4096:
            raise ValueError(f"ring_size must be a multiple of 4096 and at least 64 KiB, got {ring_size!r}")
        if isinstance(max_channels, bool) or not isinstance(max_channels, int) or not 16 <= max_channels <= 1 << 22:
            raise ValueError(f"max_channels must be an int between 16 and 4194304, got {max_channels!r}")
        if isinstance(mode, bool) or not isinstance(mode, int) or mode & ~0o666 or (mode & 0o600) != 0o600:
            raise ValueError(f"mode must be permission bits within 0o666 including 0o600, got {mode!r}")
        if not isinstance(lock_timeout, (int, float)) or not 0 < lock_timeout < 1e6:
            raise ValueError(f"lock_timeout must be a positive number of seconds, got {lock_timeout!r}")
        check_bus_name(name)
        fpath = segment_path(name) if path is None else path
        for _ in range(5):  # a creator racing us may link its segment between our attempts
            try:
                fd, shm = cls._open_fd(name, path)
            except FileNotFoundError:
                if not create:
                    raise BusNotFound(f"no shmbus segment named {name!r} ({fpath})") from None
                try:
                    fd, shm, mm = cls._create(name, path, fpath, ring_size, max_channels, codec_name, mode)
                except FileExistsError:
                    continue
            else:
                try:
                    mm = cls._attach_checked(fd, fpath, mode)
                except BaseException:
                    cls._close_fd(fd, shm)
                    raise
            seg = cls(name, fd, mm, fpath, shm, float(lock_timeout))
            try:
                seg._register_process()
            except BaseException:
                seg.close()
                raise
            return seg
        raise NotASegment(f"{fpath} keeps appearing and disappearing; another process is creating and destroying it")

    @staticmethod
    def _open_fd(name: str, path: str | None) -> tuple[int, posix_ipc.SharedMemory | None]:
        if path is None:
            try:
                shm = posix_ipc.SharedMemory(f"/shmbus.{name}", 0)
            except posix_ipc.ExistentialError:
                raise FileNotFoundError(segment_path(name)) from None
            return shm.fd, shm
        return os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC), None

    @staticmethod
    def _close_fd(fd: int, shm: posix_ipc.SharedMemory | None) -> None:
        if shm is not None:
            shm.close_fd()
        else:
            os.close(fd)

    @classmethod
    def _create(
        cls, name: str, path: str | None, fpath: str, ring_size: int, max_channels: int, codec_name: str, mode: int
    ) -> tuple[int, posix_ipc.SharedMemory | None, mmap.mmap]:
        """Build a segment under a temporary name, then link it into place (``FileExistsError`` if we lost a race)."""
        suffix = f".init-{os.getpid()}-{secrets.token_hex(4)}"
        shm: posix_ipc.SharedMemory | None = None
        if path is None:
            shm = posix_ipc.SharedMemory(f"/shmbus.{name}{suffix}", posix_ipc.O_CREX, mode=mode)
            fd, tmp = shm.fd, fpath + suffix
        else:
            tmp = path + suffix
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        mm = None
        try:
            os.fchmod(fd, mode)  # whatever the umask says
            table_off = HEADER_SIZE
            ring_off = HEADER_SIZE + _table_bytes(max_channels)
            total = ring_off + ring_size + METRICS_SIZE
            os.ftruncate(fd, total)
            mm = mmap.mmap(fd, total)
            cls._initialize(mm, table_off, ring_off, ring_size, max_channels, codec_name)
            os.link(tmp, fpath)  # FileExistsError: another process created it first; attach to theirs
        except BaseException:
            if mm is not None:
                mm.close()
            cls._close_fd(fd, shm)
            raise
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        return fd, shm, mm

    @staticmethod
    def _attach_checked(fd: int, fpath: str, mode: int) -> mmap.mmap:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotASegment(f"{fpath} is not a regular file")
        size = st.st_size
        if size == 0:
            raise NotASegment(f"{fpath} is empty: not a shmbus segment (remove it, e.g. `shmbus destroy`)")
        if size < HEADER_SIZE:
            raise NotASegment(f"{fpath} is {size} bytes: not a shmbus segment")
        mm = mmap.mmap(fd, size)
        try:
            _validate_header(mm, fpath, size, lambda: _check_ownership(st, fpath, mode))
            if bytes(mm[_OFF_BOOT : _OFF_BOOT + 16]) != _boot_id():
                fcntl.flock(fd, fcntl.LOCK_EX)  # one process re-makes the kernel objects
                try:
                    if bytes(mm[_OFF_BOOT : _OFF_BOOT + 16]) != _boot_id():
                        _reinitialize_after_reboot(mm)
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
        except BaseException:
            mm.close()
            raise
        return mm

    @staticmethod
    def _initialize(
        mm: mmap.mmap, table_off: int, ring_off: int, ring_size: int, max_channels: int, codec_name: str
    ) -> None:
        mm[0:HEADER_SIZE] = bytes(HEADER_SIZE)
        epoch = secrets.randbits(63) or 1
        _H_STATIC.pack_into(
            mm,
            0,
            MAGIC,
            LAYOUT_VERSION,
            HEADER_SIZE,
            epoch,
            time.time(),
            ring_off,
            ring_size,
            table_off,
            max_channels,
            SLOT_SIZE,
            _OFF_PROCS,
            MAX_PROCS,
            0,
            codec_name.encode()[:16],
        )
        mm[_OFF_BOOT : _OFF_BOOT + 16] = _boot_id()
        struct.pack_into("<Q", mm, _OFF_FLAGS, FLAG_METRICS)
        anchor = ctypes.c_char.from_buffer(mm)
        try:
            _native.RobustMutex.initialize(ctypes.addressof(anchor) + _OFF_MUTEX)
        finally:
            del anchor
        _U32.pack_into(mm, _OFF_READY, READY)

    def close(self) -> None:
        """Detach this process (the segment stays for the others).

        Nothing is unmapped or released here: another thread of this process may be inside a segment operation
        that holds this Segment (a publish past its attachment check). Unmapping under it would be a segfault
        (the native mutex and futex are raw addresses), and releasing its views would stop an append half done
        with the lock released normally, so no repair would run. Such an operation completes as if it came just
        before the close; the mapping goes when the last reference to this Segment does (CPython unmaps an mmap
        on deallocation).
        """
        if self._closed:
            return
        with contextlib.suppress(Exception):
            self._unregister_process()
        self._closed = True
        self._close_fd(*self._handles)

    def unlink(self) -> None:
        """Remove the segment's name: processes still attached keep their mapping until they detach."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    @staticmethod
    def destroy_by_name(name: str) -> bool:
        """Remove a segment by name; True if one existed."""
        check_bus_name(name)
        try:
            os.unlink(segment_path(name))
            return True
        except FileNotFoundError:
            return False

    # ------------------------------------------------------------------ admin
    def reset(self) -> int:
        """Empty the bus and give it a new epoch (clients see ids restart); returns the new epoch."""
        try:
            self._lock()
            self._u64[_Q_REPAIR_DUE] = RESET_DUE  # half done, no state is valid: whoever holds the lock next finishes
            epoch = self._reset_stores()
            self._u64[_Q_REPAIR_DUE] = 0
        finally:
            self._unlock()
        _native.futex_wake(self._futex_addr)
        return epoch

    def stats(self) -> SegmentStats:
        u64 = self._u64
        try:
            self._lock()
            self._reap_dead_processes()
        finally:
            self._unlock()
        # the oldest record is the first one at the tail: read forward one record (walking back from the head,
        # as global_backlog does, costs a pass over the whole ring: 0.2 s on a full 32 MiB one). On a full ring a
        # concurrent append may overwrite it while we read: then read again at the new tail.
        # The three words are read tail first, id last: both positions only grow and tail <= head at every
        # instant, so a reader descheduled between two reads still sees tail <= head (equal only when the ring was
        # empty), and the id covers every record below that head (read head first and tail last, a reader paused
        # while the ring laps sees head < tail and takes a full ring for an empty one).
        oldest_rec: list[Record] = []
        for _ in range(1000):
            tail, head, gid = u64[_Q_TAIL], u64[_Q_HEAD], u64[_Q_GID]
            if head <= tail:
                break
            oldest_rec = self.read_since(tail, limit=1)[0]
            if oldest_rec:
                break
        else:  # lapped 1000 times in a row: read under the lock (no append can move the tail meanwhile)
            try:
                self._lock()
                gid, head, tail = u64[_Q_GID], u64[_Q_HEAD], u64[_Q_TAIL]
                oldest_rec = self.read_since(tail, limit=1)[0] if head > tail else []
            finally:
                self._unlock()
        if oldest_rec and oldest_rec[0].global_id > gid:  # lapped to a record newer than the figures read with it
            tail, head, gid = u64[_Q_TAIL], u64[_Q_HEAD], u64[_Q_GID]
            # an append commits the head before it stores the global id: a writer paused between the two stores
            # shows a committed record newer than the id. The record is published; the id is behind by a store.
            gid = max(gid, oldest_rec[0].global_id)
        published = gid  # global ids are contiguous from 1 since creation or the last reset
        oldest_gid = oldest_rec[0].global_id if oldest_rec else gid + 1
        history = time.time() - oldest_rec[0].timestamp if oldest_rec else 0.0
        return SegmentStats(
            name=self.name,
            path=self.path,
            epoch=self.read_epoch(),
            size=len(self.mm),
            ring_size=self.ring_size,
            max_channels=self.max_channels,
            channels=self._u32[_I_CHANNELS],
            global_id=gid,
            head=head,
            tail=tail,
            oldest_global_id=oldest_gid,
            published=published,
            overwritten=u64[_Q_OVERWRITTEN],
            repairs=u64[_Q_REPAIRS],
            ring_used=min(head - tail, self.ring_size),
            history_seconds=history,
            processes=self.processes(),
            sleepers=self._u32[_I_SLEEPERS],
            created_at=self.created_at,
        )
