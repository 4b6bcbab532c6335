"""The shared-memory segment: a crash-safe global log of variable-length records plus a channel index.

Layout (all integers little-endian, every mutable field naturally aligned)::

    [0, 4096)            header: magic, layout version, epoch, sizes, robust mutex, commit state, futex word,
                         process table
    [4096, T)            channel table: ``max_channels`` slots of 320 bytes (name, a version word and two copies
                         of the channel's state)
    [T, T + ring_size)   the ring: records ``[hdr 52 B][channel][site][meta][payload][pad][footer u32]``,
                         16-byte aligned, never wrapping (a PAD record fills the end of the ring instead)

Positions are absolute byte offsets that only grow (``pos % ring_size`` is the place in the ring), so a reader
knows it was lapped when ``tail > pos``. Writers hold the robust mutex; readers never lock.

Why lock-free reads are safe (x86-64 only; other architectures are refused by :func:`_native.supported`):

* **One store per field.** Every field a reader may read while a writer runs (``head``, ``tail``, ``global_id``,
  the epoch, the table generation, a slot's version word, the futex word) is written and read through a typed
  ``memoryview`` cast (``"Q"``/``"I"``): CPython copies the item with one ``memcpy`` of 8 (or 4) bytes, which the
  compiler emits as one aligned ``mov``, atomic on x86-64. ``struct.pack_into`` is never used on such a field: it
  zero-fills its destination and then writes the value byte by byte, so a concurrent reader could see 0 or a mix.
* **Order.** x86-64 keeps stores in program order and loads in program order (TSO); each memoryview access is an
  opaque call, so the C compiler cannot reorder them either. A writer publishes in this order: advance ``tail``
  past what it will overwrite; write the record; write the channel's *inactive* state copy; flip the slot's
  version word; store ``head`` (the commit); store ``global_id``; bump the futex word. A reader that sees a later
  store also sees every earlier one.
* **Records** are immutable until the ring laps them. A reader copies a record, then re-reads ``tail``: if it moved
  past the record, the copy may be torn and is dropped (and reported as lost).
* **Channel state** is double-buffered (a seqlock whose writer never makes a reader wait): the writer fills the copy
  the version word does not point at, then flips the word. A reader reads the word, the copy it names, and the word
  again; equal words mean an untorn copy. A writer killed mid-copy leaves the word, and so the readable copy,
  untouched. A copy that points at a record past ``head`` belongs to a publish not yet committed: the reader uses
  the other copy (the state before it).

Crash safety: a writer killed after any store leaves a state that is either "committed" (``head`` moved) or "not
committed"; the next locker gets ``EOWNERDEAD`` and :meth:`Segment._repair` flips back slots that name uncommitted
records and re-derives ``global_id`` and the channel count. The test suite kills a writer after every single store
of the append path (:meth:`Segment._kill_after_store`) and verifies from a fresh process.

Per channel, records are chained backwards (``prev``), so reading a channel's backlog costs O(messages returned);
the walk checks ``tail`` before trusting a record and refuses a chain that does not strictly descend
(:class:`~shmbus.errors.SegmentCorrupt`), so a damaged segment can neither loop a reader nor hide a gap.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import mmap
import os
import secrets
import signal
import stat
import struct
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import posix_ipc

from . import _native
from .errors import (
    ChannelTableFull,
    LayoutMismatch,
    NotASegment,
    PayloadTooLarge,
    SegmentCorrupt,
    UnsafeSegment,
    UnsupportedPlatform,
)

__all__ = ["Record", "Segment", "SegmentStats", "segment_path"]

MAGIC = b"shmbus\x00\x01"
LAYOUT_VERSION = 2
HEADER_SIZE = 4096
SLOT_SIZE = 320
SLOT_HDR = 128
MAX_KEY_BYTES = SLOT_SIZE - SLOT_HDR  # channel + "$|$" + site, UTF-8
MAX_PROCS = 128
ALIGN = 16
READY = 0x52454459  # "REDY"
MIN_RING = 64 << 10
DEFAULT_LOCK_TIMEOUT = 5.0

# header fields (byte offsets; all 8-byte fields 8-aligned)
_H_STATIC = struct.Struct("<8sIIQdQQQIIQII16s")  # magic..codec, at 0
_OFF_EPOCH = 16
_OFF_READY = 76
_OFF_MUTEX = 128
_OFF_HEAD = 192
_OFF_GID = 200
_OFF_TAIL = 208
_OFF_TABLE_GEN = 216
_OFF_OVERWRITTEN = 232
_OFF_REPAIRS = 240
_OFF_FUTEX = 256
_OFF_SLEEPERS = 260
_OFF_CHANNELS = 264
_OFF_BOOT = 280  # 16 bytes of the boot id: kernel objects (mutex, futex) must be re-made after a reboot
_OFF_PROCS = 512  # MAX_PROCS x 16: pid u32, sleeping u32, attached_at f64
_PROC_SIZE = 16

# indexes into the typed views
_Q_EPOCH = _OFF_EPOCH >> 3
_Q_HEAD = _OFF_HEAD >> 3
_Q_GID = _OFF_GID >> 3
_Q_TAIL = _OFF_TAIL >> 3
_Q_TABLE_GEN = _OFF_TABLE_GEN >> 3
_Q_OVERWRITTEN = _OFF_OVERWRITTEN >> 3
_Q_REPAIRS = _OFF_REPAIRS >> 3
_I_FUTEX = _OFF_FUTEX >> 2
_I_SLEEPERS = _OFF_SLEEPERS >> 2
_I_CHANNELS = _OFF_CHANNELS >> 2
_I_READY = _OFF_READY >> 2

# records
_REC = struct.Struct("<IIQQQdHHII")  # length, kind, global id, message id, prev (pos+1), ts, lengths x4
REC_HDR = _REC.size  # 52
KIND_MSG = 1
KIND_PAD = 2
_PAD = struct.Struct("<II")
_U32 = struct.Struct("<I")
_STATE = struct.Struct("<QQQQ")  # head, global_id, tail, table_gen: read in bulk only under the lock
_WAKE = struct.Struct("<II")  # futex word, sleeper count: likewise
_ZEROS = [bytes(n) for n in range(ALIGN)]

# channel slots: state u32, name_len u32, hash u64, version u64, reserved u64, copy 0 (48 B), copy 1 (48 B), name
_SLOT_KEY = struct.Struct("<IIQ")
_SLOT_BODY = struct.Struct("<QQQQdd")  # last_id, newest (pos+1), trim_below, since_gid, last publish ts, ttl
_BODY = _SLOT_BODY.size
_OFF_SLOT_VERSION = 16
_OFF_SLOT_COPY = 32
_ZERO_COPIES = bytes(2 * _SLOT_BODY.size)
SLOT_EMPTY = 0
SLOT_USED = 1
SLOT_TOMBSTONE = 2

_libc_boot_id: bytes | None = None


def _boot_id() -> bytes:
    global _libc_boot_id
    if _libc_boot_id is None:
        try:
            with open("/proc/sys/kernel/random/boot_id", "rb") as f:
                _libc_boot_id = bytes.fromhex(f.read().strip().replace(b"-", b"").decode())[:16]
        except OSError:
            _libc_boot_id = b"\x00" * 16
    return _libc_boot_id


def segment_path(name: str) -> str:
    """Where the segment of bus ``name`` lives in the filesystem (tmpfs)."""
    return f"/dev/shm/shmbus.{name}"


def _table_bytes(max_channels: int) -> int:
    return (max_channels * SLOT_SIZE + 4095) & ~4095


class Record(NamedTuple):
    """One committed message as stored: bytes, not decoded (the bus decodes lazily)."""

    pos: int
    global_id: int
    message_id: int
    timestamp: float
    channel: bytes
    site: bytes
    meta: bytes
    payload: bytes


@dataclass
class ChannelInfo:
    key: bytes
    last_id: int
    oldest_id: int  # oldest id still readable (last_id + 1 when nothing is)
    last_publish: float
    expired: bool


@dataclass
class SegmentStats:
    name: str
    path: str
    epoch: int
    size: int
    ring_size: int
    max_channels: int
    channels: int
    global_id: int
    head: int
    tail: int
    oldest_global_id: int
    published: int
    overwritten: int
    repairs: int
    ring_used: int
    history_seconds: float
    processes: list[int]
    sleepers: int
    created_at: float


class Segment:
    """One attached segment. Create or attach with :meth:`open`; all methods are thread-safe."""

    def __init__(self, name: str, fd: int, mm: mmap.mmap, path: str, owner_shm: posix_ipc.SharedMemory | None,
                 lock_timeout: float = DEFAULT_LOCK_TIMEOUT):
        self.name = name
        self.path = path
        self._fd = fd
        self._shm = owner_shm
        self.mm = mm
        self.lock_timeout = lock_timeout
        (_magic, _version, _hsize, self.epoch, self.created_at, self.ring_off, self.ring_size, self.table_off,
         self.max_channels, _slot_size, _procs_off, _max_procs, _ready, _codec_raw) = _H_STATIC.unpack_from(mm, 0)
        self.codec_name = _codec_raw.rstrip(b"\x00").decode("ascii", "replace")
        self.max_record = self.ring_size // 4
        # Every store of the append path goes through _buf (byte ranges, the mapping itself: slice assignment on
        # an mmap is cheaper than on a memoryview), _u64 or _u32 (single aligned stores); see _kill_after_store.
        self._buf: Any = mm
        view = memoryview(mm)
        self._u64: Any = view.cast("Q")
        self._u32: Any = view.cast("I")
        view.release()
        self._anchor = ctypes.c_char.from_buffer(mm)
        base = ctypes.addressof(self._anchor)
        self._futex_addr = base + _OFF_FUTEX
        self.mutex = _native.RobustMutex(base + _OFF_MUTEX)
        self._mutex_ptr = ctypes.c_void_p(base + _OFF_MUTEX)
        self._slot_cache: dict[bytes, int] = {}  # key -> byte offset of its slot (valid for _table_gen)
        self._table_gen = -1
        self._proc_index = -1
        self._closed = False

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
        if not _native.supported():
            raise UnsupportedPlatform("shmbus needs Linux with glibc on x86-64 (robust mutexes, futexes, TSO)")
        if isinstance(ring_size, bool) or not isinstance(ring_size, int) or ring_size < MIN_RING or ring_size % 4096:
            raise ValueError(f"ring_size must be a multiple of 4096 and at least 64 KiB, got {ring_size!r}")
        if isinstance(max_channels, bool) or not isinstance(max_channels, int) or not 16 <= max_channels <= 1 << 22:
            raise ValueError(f"max_channels must be an int between 16 and 4194304, got {max_channels!r}")
        if isinstance(mode, bool) or not isinstance(mode, int) or mode & ~0o666 or (mode & 0o600) != 0o600:
            raise ValueError(f"mode must be permission bits within 0o666 including 0o600, got {mode!r}")
        if not isinstance(lock_timeout, (int, float)) or not 0 < lock_timeout < 1e6:
            raise ValueError(f"lock_timeout must be a positive number of seconds, got {lock_timeout!r}")
        fpath = segment_path(name) if path is None else path
        for _ in range(5):  # a creator racing us may link its segment between our attempts
            try:
                fd, shm = cls._open_fd(name, path)
            except FileNotFoundError:
                if not create:
                    raise FileNotFoundError(f"no shmbus segment named {name!r} ({fpath})") from None
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
    def _create(cls, name: str, path: str | None, fpath: str, ring_size: int, max_channels: int, codec_name: str,
                mode: int) -> tuple[int, posix_ipc.SharedMemory | None, mmap.mmap]:
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
            total = ring_off + ring_size
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
            if bytes(mm[_OFF_BOOT:_OFF_BOOT + 16]) != _boot_id():
                fcntl.flock(fd, fcntl.LOCK_EX)  # one process re-makes the kernel objects
                try:
                    if bytes(mm[_OFF_BOOT:_OFF_BOOT + 16]) != _boot_id():
                        _reinitialize_after_reboot(mm)
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
        except BaseException:
            mm.close()
            raise
        return mm

    @staticmethod
    def _initialize(mm: mmap.mmap, table_off: int, ring_off: int, ring_size: int, max_channels: int,
                    codec_name: str) -> None:
        mm[0:HEADER_SIZE] = bytes(HEADER_SIZE)
        epoch = secrets.randbits(63) or 1
        _H_STATIC.pack_into(mm, 0, MAGIC, LAYOUT_VERSION, HEADER_SIZE, epoch, time.time(), ring_off, ring_size,
                            table_off, max_channels, SLOT_SIZE, _OFF_PROCS, MAX_PROCS, 0,
                            codec_name.encode()[:16])
        mm[_OFF_BOOT:_OFF_BOOT + 16] = _boot_id()
        anchor = ctypes.c_char.from_buffer(mm)
        try:
            _native.RobustMutex.initialize(ctypes.addressof(anchor) + _OFF_MUTEX)
        finally:
            del anchor
        _U32.pack_into(mm, _OFF_READY, READY)

    def close(self) -> None:
        """Detach this process (the segment stays for the others)."""
        if self._closed:
            return
        with contextlib.suppress(Exception):
            self._unregister_process()
        self._closed = True
        del self._anchor
        self.mutex = None  # type: ignore[assignment]
        for view in (self._u64, self._u32):
            with contextlib.suppress(Exception):
                view.release()
        try:
            self.mm.close()
        except BufferError:  # a Record memoryview still alive somewhere; the mapping goes with the process
            pass
        self._close_fd(self._fd, self._shm)

    def unlink(self) -> None:
        """Remove the segment's name: processes still attached keep their mapping until they detach."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    @staticmethod
    def destroy_by_name(name: str) -> bool:
        """Remove a segment by name; True if one existed."""
        try:
            os.unlink(segment_path(name))
            return True
        except FileNotFoundError:
            return False

    # ------------------------------------------------------------------ locking and repair
    def _lock(self) -> None:
        if _native.mutex_lock(self._mutex_ptr, self.lock_timeout):
            self._repair()

    def _unlock(self) -> None:
        _native.mutex_unlock(self._mutex_ptr)

    def _repair(self) -> None:
        """Undo what a writer that died holding the lock left behind (called with the lock held).

        Only ``head`` makes a record visible, and every other store is either atomic or lands where no reader looks
        (past ``head``, or the inactive copy of a slot). So: a slot whose current copy names a record at or past
        ``head`` is flipped back (its other copy is the state before that publish); ``global_id`` (stored after
        ``head``) is re-derived from the newest committed record; the channel count is recounted.
        """
        u64, u32 = self._u64, self._u32
        head, tail = u64[_Q_HEAD], u64[_Q_TAIL]
        if tail > head or head - tail > self.ring_size or head % ALIGN or tail % ALIGN:
            raise SegmentCorrupt(f"{self.path}: commit state head={head} tail={tail} is impossible")
        last_gid = self._last_committed_gid(head, tail)
        if last_gid is not None and last_gid != u64[_Q_GID]:
            u64[_Q_GID] = last_gid
        used = 0
        for i in range(self.max_channels):
            off = self.table_off + i * SLOT_SIZE
            if u32[off >> 2] != SLOT_USED:
                continue
            used += 1
            version = u64[(off + _OFF_SLOT_VERSION) >> 3]
            newest = u64[(off + _OFF_SLOT_COPY + (version & 1) * _SLOT_BODY.size + 8) >> 3]
            if newest and newest - 1 >= head:  # the dead writer's publish never committed: back to the old copy
                u64[(off + _OFF_SLOT_VERSION) >> 3] = version + 1
        u32[_I_CHANNELS] = used
        u64[_Q_TABLE_GEN] += 1  # every process drops its cached slot numbers
        u64[_Q_REPAIRS] += 1
        u32[_I_FUTEX] = (u32[_I_FUTEX] + 1) & 0xFFFFFFFF
        self._slot_cache.clear()

    def _last_committed_gid(self, head: int, tail: int) -> int | None:
        mm, ring, base = self.mm, self.ring_size, self.ring_off
        end = head
        while end > tail:
            (length,) = _U32.unpack_from(mm, base + ((end - 1) % ring) - 3)
            if length < ALIGN or length % ALIGN or length > ring or end - length < tail:
                raise SegmentCorrupt(f"{self.path}: record footer at {end} names length {length}")
            start = end - length
            length2, kind = _PAD.unpack_from(mm, base + start % ring)
            if length2 != length or kind not in (KIND_MSG, KIND_PAD):
                raise SegmentCorrupt(f"{self.path}: record at {start} does not match its footer")
            if kind == KIND_MSG:
                return int(struct.unpack_from("<Q", mm, base + start % ring + 8)[0])
            end = start
        return None

    # ------------------------------------------------------------------ writing
    def append(
        self,
        channel: bytes,
        site: bytes,
        payload: bytes,
        meta: bytes = b"",
        max_backlog_size: int = 1000,
        max_backlog_age: float = 604800.0,
        clear_every: int = 1,
        *,
        global_id: int | None = None,
        message_id: int | None = None,
        timestamp: float | None = None,
        expect_global_id: int | None = None,
    ) -> tuple[int, int]:
        """Append one record; return ``(global_id, message_id)``.

        The caller (:class:`~shmbus.bus.Bus`) has validated every argument: nothing here may raise after the first
        store. ``global_id``/``message_id`` impose externally assigned ids (the Redis bridge): a record whose
        global id is not above the segment's is skipped and ``(0, 0)`` returned, so replays are idempotent. An
        imposed ``message_id`` that does not follow the channel's last id starts a new chain (older ids are
        reported as a gap, not silently missing). ``expect_global_id`` skips the append (``(0, 0)``) unless the
        segment's global id is exactly that value, checked under the lock (a publisher may then append its own
        message without creating a hole the relay would never fill).
        """
        key = channel + b"$|$" + site if site else channel
        if len(key) > MAX_KEY_BYTES:
            raise ValueError(f"channel plus site id is {len(key)} bytes; the limit is {MAX_KEY_BYTES}")
        total = REC_HDR + len(channel) + len(site) + len(meta) + len(payload) + 4
        rec_len = (total + 15) & ~15
        if rec_len > self.max_record:
            raise PayloadTooLarge(
                f"message on {channel.decode(errors='replace')!r} is {rec_len} bytes encoded; "
                f"this bus accepts at most {self.max_record} (a quarter of ring_size={self.ring_size})")
        ts = time.time() if timestamp is None else timestamp
        body_pack = _SLOT_BODY.pack
        ring = self.ring_size
        sleepers = 0
        if _native.mutex_lock(self._mutex_ptr, self.lock_timeout):  # EOWNERDEAD: the last writer died holding it
            self._repair()
        try:
            # Under the lock no other writer runs, so the fields only writers change can be read in bulk with
            # struct; every store below that a reader may race with is a single typed-view store.
            mm, u64, buf = self.mm, self._u64, self._buf
            head, gid, tail, table_gen = _STATE.unpack_from(mm, _OFF_HEAD)
            if expect_global_id is not None and gid != expect_global_id:
                return 0, 0
            if global_id is None:
                new_gid = gid + 1
            elif global_id <= gid:
                return 0, 0
            else:
                new_gid = global_id
            if table_gen != self._table_gen:
                self._slot_cache.clear()
                self._table_gen = table_gen
            soff = self._slot_cache.get(key)
            if soff is None:
                soff = self._find_slot(key, insert=True, now=ts, tail=tail)
            version = u64[(soff + _OFF_SLOT_VERSION) >> 3]
            copy = soff + _OFF_SLOT_COPY + (version & 1) * _BODY
            last_id, newest, trim_below, since_gid, last_ts, ttl = _SLOT_BODY.unpack_from(mm, copy)
            if last_id and ts - last_ts > ttl:  # expired like the gem's Redis TTL: ids restart at 1
                last_id = newest = trim_below = 0
            new_mid = last_id + 1 if message_id is None else message_id
            if last_id == 0 or new_mid != last_id + 1:
                since_gid = new_gid
                newest = 0
                trim_below = max(new_mid - 1, 0) if message_id is not None else 0
            pos = head
            off = pos % ring
            if off + rec_len > ring:
                pad = ring - off
                tail = self._advance_tail(tail, pos + pad + rec_len - ring, head)
                start = self.ring_off + off
                buf[start:start + 8] = _PAD.pack(pad, KIND_PAD)
                buf[self.ring_off + ring - 4:self.ring_off + ring] = _U32.pack(pad)
                pos += pad
                off = 0
            elif pos + rec_len - ring > tail:
                tail = self._advance_tail(tail, pos + rec_len - ring, head)
            start = self.ring_off + off
            buf[start:start + rec_len] = b"".join((
                _REC.pack(rec_len, KIND_MSG, new_gid, new_mid, newest, ts, len(channel), len(site), len(meta),
                          len(payload)),
                channel, site, meta, payload, _ZEROS[rec_len - total], _U32.pack(rec_len)))
            if clear_every <= 1 or new_mid % clear_every == 0:
                trim_below = max(trim_below, new_mid - max_backlog_size)
            other = copy + _BODY if version & 1 == 0 else copy - _BODY  # the copy no reader is told to read
            buf[other:other + _BODY] = body_pack(new_mid, pos + 1, trim_below, since_gid, ts, max_backlog_age)
            u64[(soff + _OFF_SLOT_VERSION) >> 3] = version + 1
            u64[_Q_HEAD] = pos + rec_len  # the commit
            u64[_Q_GID] = new_gid
            word, sleepers = _WAKE.unpack_from(mm, _OFF_FUTEX)
            self._u32[_I_FUTEX] = (word + 1) & 0xFFFFFFFF
        finally:
            _native.mutex_unlock(self._mutex_ptr)
        if sleepers:
            _native.futex_wake(self._futex_addr)
        return new_gid, new_mid

    def _advance_tail(self, tail: int, need: int, head: int) -> int:
        """Move ``tail`` past every record that overlaps ``[.., need)``; stored before any byte is overwritten."""
        mm, ring, base = self.mm, self.ring_size, self.ring_off
        dropped = 0
        while tail < need and tail < head:
            length, kind = _PAD.unpack_from(mm, base + tail % ring)
            if length < ALIGN or length % ALIGN or length > ring - tail % ring:
                raise SegmentCorrupt(f"{self.path}: record at {tail} has length {length}")
            if kind == KIND_MSG:
                dropped += 1
            tail += length
        if tail < need:
            tail = need  # the ring was empty up to here (e.g. right after a reset)
        self._u64[_Q_TAIL] = tail
        if dropped:
            self._u64[_Q_OVERWRITTEN] += dropped
        return tail

    # ------------------------------------------------------------------ channel table
    def _find_slot(self, key: bytes, *, insert: bool, now: float = 0.0, tail: int = 0) -> int:
        """Byte offset of ``key``'s slot (caller holds the lock when ``insert``); -1 when absent and not inserting."""
        mm, n, base = self.mm, self.max_channels, self.table_off
        h = zlib.crc32(key)
        i = h % n
        first_free = -1
        klen = len(key)
        for _ in range(n):
            off = base + i * SLOT_SIZE
            state, nlen, sh = _SLOT_KEY.unpack_from(mm, off)
            if state == SLOT_EMPTY:
                if first_free < 0:
                    first_free = i
                break
            if state == SLOT_TOMBSTONE:
                if first_free < 0:
                    first_free = i
            elif sh == h and nlen == klen and mm[off + SLOT_HDR:off + SLOT_HDR + klen] == key:
                self._slot_cache[key] = off
                return off
            i = (i + 1) % n
        if not insert:
            return -1
        used = self._u32[_I_CHANNELS]
        if first_free < 0 or used >= n * 9 // 10:
            victim = self._evict(now, tail)
            if first_free < 0:
                first_free = victim
        off = base + first_free * SLOT_SIZE
        buf = self._buf
        # Fill the slot while its state still says free, then publish it with one store of the state word.
        buf[off + SLOT_HDR:off + SLOT_HDR + klen] = key
        buf[off + 4:off + 16] = struct.pack("<IQ", klen, h)
        buf[off + _OFF_SLOT_COPY:off + _OFF_SLOT_COPY + len(_ZERO_COPIES)] = _ZERO_COPIES
        self._u32[off >> 2] = SLOT_USED
        self._u32[_I_CHANNELS] = used + 1
        self._slot_cache[key] = off
        return off

    def _evict(self, now: float, tail: int) -> int:
        """Free the least recently published slot whose messages are all gone (expired or overwritten)."""
        best, best_ts = -1, float("inf")
        for i in range(self.max_channels):
            off = self.table_off + i * SLOT_SIZE
            if self._u32[off >> 2] != SLOT_USED:
                continue
            last_id, newest, _, _, ts, ttl = self._slot_copy(off)
            expired = last_id and now - ts > ttl
            if (expired or newest == 0 or newest - 1 < tail) and ts < best_ts:
                best, best_ts = i, ts
        if best < 0:
            raise ChannelTableFull(
                f"all {self.max_channels} channel slots hold channels with retained messages; "
                "create the bus with a larger max_channels")
        off = self.table_off + best * SLOT_SIZE
        self._u32[off >> 2] = SLOT_TOMBSTONE
        self._u32[_I_CHANNELS] -= 1
        self._u64[_Q_TABLE_GEN] += 1
        self._slot_cache.clear()
        return best

    def _slot_copy(self, off: int) -> tuple[int, int, int, int, float, float]:
        """The current copy of the slot at byte offset ``off`` (exact under the lock; see :meth:`_read_slot`)."""
        version = self._u64[(off + _OFF_SLOT_VERSION) >> 3]
        return _SLOT_BODY.unpack_from(self.mm, off + _OFF_SLOT_COPY + (version & 1) * _SLOT_BODY.size)

    def _read_slot(self, off: int) -> tuple[int, int, int, int, float, float] | None:
        """Lock-free, untorn, committed state of the slot at ``off``; None if the slot was reused meanwhile."""
        u64, mm = self._u64, self.mm
        vq = (off + _OFF_SLOT_VERSION) >> 3
        base = off + _OFF_SLOT_COPY
        size = _SLOT_BODY.size
        for attempt in range(1 << 20):
            gen = u64[_Q_TABLE_GEN]
            version = u64[vq]
            body = _SLOT_BODY.unpack_from(mm, base + (version & 1) * size)
            if body[1] and body[1] - 1 >= u64[_Q_HEAD]:  # that publish has not committed: the state before it
                body = _SLOT_BODY.unpack_from(mm, base + ((version - 1) & 1) * size)
            if u64[vq] == version:
                return body if u64[_Q_TABLE_GEN] == gen else None
            if attempt > 64:
                time.sleep(0)  # a writer flipping this slot faster than we read: let it run
        raise SegmentCorrupt(f"{self.path}: the slot at {off} never stopped changing")

    def _lookup(self, key: bytes) -> int:
        gen = self._u64[_Q_TABLE_GEN]
        if gen != self._table_gen:
            self._slot_cache.clear()
            self._table_gen = gen
        off = self._slot_cache.get(key)
        if off is None:
            off = self._find_slot(key, insert=False)
        return off

    # ------------------------------------------------------------------ reading (lock-free)
    def head(self) -> int:
        return int(self._u64[_Q_HEAD])

    def tail(self) -> int:
        return int(self._u64[_Q_TAIL])

    def global_id(self) -> int:
        return int(self._u64[_Q_GID])

    def read_epoch(self) -> int:
        return int(self._u64[_Q_EPOCH])

    def futex_word(self) -> int:
        return int(self._u32[_I_FUTEX])

    def _bad_record(self, pos: int, what: str) -> bool:
        """A record that makes no sense: True if the ring lapped the reader (a torn copy); else it is damage."""
        if self._u64[_Q_TAIL] > pos:
            return True
        raise SegmentCorrupt(f"{self.path}: record at position {pos}: {what}")

    def read_since(self, pos: int, limit: int = 4096) -> tuple[list[Record], int, bool]:
        """Records committed at or after ``pos`` (the listener's cursor).

        Returns ``(records, next_pos, lost)`` where ``lost`` is True when the ring overwrote records before they
        were read (the cursor then jumps to ``tail``; compare global ids to count them). Raises
        :class:`~shmbus.errors.SegmentCorrupt` for a record that is damaged rather than lapped.
        """
        mm, ring, base, u64 = self.mm, self.ring_size, self.ring_off, self._u64
        epoch = u64[_Q_EPOCH]
        head, tail = u64[_Q_HEAD], u64[_Q_TAIL]
        lost = False
        if pos < tail:
            lost = True
            pos = tail
        out: list[Record] = []
        unpack, unpack_pad = _REC.unpack_from, _PAD.unpack_from
        while pos < head and len(out) < limit:
            off = pos % ring
            start = base + off
            length, kind = unpack_pad(mm, start)
            malformed = length < ALIGN or length % ALIGN or off + length > ring or kind not in (KIND_MSG, KIND_PAD)
            if (malformed or (kind == KIND_MSG and length < REC_HDR + 4)) and self._bad_record(
                    pos, f"length {length}, kind {kind}"):
                break
            if kind == KIND_MSG:
                _, _, gid, mid, _prev, ts, cl, sl, ml, pl = unpack(mm, start)
                if REC_HDR + cl + sl + ml + pl + 4 > length and self._bad_record(
                        pos, f"fields of {cl + sl + ml + pl} bytes in a {length}-byte record"):
                    break
                b = start + REC_HDR
                raw = mm[b:b + cl + sl + ml + pl]
                out.append(Record(pos, gid, mid, ts, raw[:cl], raw[cl:cl + sl], raw[cl + sl:cl + sl + ml],
                                  raw[cl + sl + ml:]))
            pos += length
        tail = u64[_Q_TAIL]
        if out and out[0].pos < tail:
            out = [r for r in out if r.pos >= tail]
            lost = True
        if pos < tail:
            pos = tail
            lost = True
        if u64[_Q_EPOCH] != epoch:  # reset meanwhile: nothing read belongs to the new bus
            return [], u64[_Q_TAIL], False
        return out, pos, lost

    def channel_state(self, key: bytes) -> tuple[int, int, int, int]:
        """``(last_id, newest_pos_plus_1, trim_below, since_gid)`` of a channel, honouring expiry; zeros if unknown.

        The state is the slot's committed copy, read untorn (see the module docstring).
        """
        for _ in range(1000):
            off = self._lookup(key)
            if off < 0:
                return 0, 0, 0, 0
            body = self._read_slot(off)
            if body is None:  # the table changed under us: look the channel up again
                self._slot_cache.clear()
                continue
            last_id, newest, trim_below, since_gid, ts, ttl = body
            if last_id and time.time() - ts > ttl:
                return 0, 0, 0, 0
            return int(last_id), int(newest), int(trim_below), int(since_gid)
        raise SegmentCorrupt(f"{self.path}: the channel table never stopped changing")

    def last_id(self, key: bytes) -> int:
        return self.channel_state(key)[0]

    def channel_backlog(
        self, key: bytes, after_id: int, *, upto: int | None = None, limit: int | None = None
    ) -> tuple[list[Record], int, int]:
        """Retained records of one channel with ``after_id < message_id <= upto``, oldest first.

        Returns ``(records, last_id, first_available)``. ``first_available`` is the oldest id still readable
        (``last_id + 1`` when none is); ``first_available > after_id + 1`` means the messages in between are gone
        (trimmed by the channel's backlog limit, or overwritten by the ring): reported, never a silent hole.
        The records' ``pos`` is -1 (not tracked for backlog reads). Built on :meth:`channel_columns`.
        """
        mids, gids, stamps, payloads, metas, last_id, first = self.channel_columns(key, after_id, upto)
        channel, _, site = key.partition(b"$|$")
        n = len(mids) if limit is None else min(limit, len(mids))
        out = [Record(-1, gids[i], mids[i], stamps[i], channel, site, metas[i], payloads[i]) for i in range(n)]
        return out, last_id, first

    def channel_columns(
        self, key: bytes, after_id: int, upto: int | None = None
    ) -> tuple[list[int], list[int], list[float], list[bytes], list[bytes], int, int]:
        """The walk behind :meth:`channel_backlog`, as columns (bulk readers such as the Spark source use it
        directly: no object per message).

        Returns ``(message_ids, global_ids, timestamps, payloads, metas, last_id, first_available)``, oldest
        first, with the range and ``first_available`` meaning of :meth:`channel_backlog`. It walks the channel's
        chain back from its newest record. Each step first checks that the ring has not overwritten the position,
        then copies, then checks again (a torn copy is never trusted, so an overwritten message is reported as a
        gap, never skipped silently). The chain must strictly descend in position, global id and message id, so
        the walk ends after at most one ring of records; a damaged chain raises
        :class:`~shmbus.errors.SegmentCorrupt`.
        """
        for _ in range(100):
            epoch = self._u64[_Q_EPOCH]
            result = self._walk_channel(key, after_id, upto)
            if self._u64[_Q_EPOCH] == epoch:
                return result
        raise SegmentCorrupt(f"{self.path}: the bus kept being reset during a backlog read")

    def _walk_channel(
        self, key: bytes, after_id: int, upto: int | None
    ) -> tuple[list[int], list[int], list[float], list[bytes], list[bytes], int, int]:
        last_id, newest, trim_below, since_gid = self.channel_state(key)
        lowest = max(after_id, trim_below)
        hi = last_id if upto is None else min(upto, last_id)
        mm, ring, base, u64 = self.mm, self.ring_size, self.ring_off, self._u64
        channel, _, site = key.partition(b"$|$")
        key_cl, key_sl = len(channel), len(site)
        unpack = _REC.unpack_from
        mids: list[int] = []
        gids: list[int] = []
        stamps: list[float] = []
        payloads: list[bytes] = []
        metas: list[bytes] = []
        reached = last_id + 1
        pos = newest - 1
        above_pos, above_mid, above_gid = 1 << 63, last_id + 1, 1 << 64
        while pos >= 0:
            if u64[_Q_TAIL] > pos:
                break  # overwritten: this and everything older is gone (reached stays at the oldest one read)
            off = pos % ring
            start = base + off
            if off + REC_HDR > ring and self._bad_record(pos, "a message header would cross the end of the ring"):
                break
            length, kind, gid, mid, prev, ts, cl, sl, ml, pl = unpack(mm, start)
            payload = meta = b""
            sane = (kind == KIND_MSG and off + length <= ring and REC_HDR + cl + sl + ml + pl + 4 <= length
                    and cl == key_cl and sl == key_sl)
            if sane and lowest < mid <= hi and gid >= since_gid:
                p = start + REC_HDR + cl + sl
                meta = mm[p:p + ml] if ml else b""
                payload = mm[p + ml:p + ml + pl]
            if u64[_Q_TAIL] > pos:
                break  # the copy may be torn: drop it, and everything older is gone
            # Committed and not overwritten: the record is exactly what its writer wrote. Trust it only if sane.
            if not sane or not (pos < above_pos and mid < above_mid and gid < above_gid and prev - 1 < pos):
                raise SegmentCorrupt(
                    f"{self.path}: channel {key!r} chain broken at position {pos} (kind {kind}, id {mid}, "
                    f"global id {gid}, previous at {prev - 1})")
            if mid <= lowest or gid < since_gid:
                reached = lowest + 1
                break
            reached = mid
            if mid <= hi:
                mids.append(mid)
                gids.append(gid)
                stamps.append(ts)
                payloads.append(payload)
                metas.append(meta)
            above_pos, above_mid, above_gid = pos, mid, gid
            pos = prev - 1
        for col in (mids, gids, stamps, payloads, metas):
            col.reverse()
        return mids, gids, stamps, payloads, metas, last_id, max(reached, 1) if last_id > after_id else after_id + 1

    def global_backlog(self, after_gid: int, limit: int | None = None) -> list[Record]:
        """Committed records with global id greater than ``after_gid``, oldest first (walks back from head)."""
        mm, ring, base, u64 = self.mm, self.ring_size, self.ring_off, self._u64
        head, tail = u64[_Q_HEAD], u64[_Q_TAIL]
        start = head
        while start > tail:
            (length,) = _U32.unpack_from(mm, base + (start - 1) % ring - 3)
            if length < ALIGN or length % ALIGN or length > ring or start - length < tail:
                break
            p = start - length
            kind, gid = struct.unpack_from("<IQ", mm, base + p % ring + 4)
            if kind == KIND_MSG and gid <= after_gid:
                break
            start = p
        want = 1 << 62 if limit is None else limit
        if u64[_Q_TAIL] > start:  # the ring moved under the walk: its footers may be torn; start at tail
            start, want = u64[_Q_TAIL], 1 << 62
        records, _, _ = self.read_since(start, limit=want)
        records = [r for r in records if r.global_id > after_gid]
        return records if limit is None else records[:limit]

    def iter_channels(self) -> Iterator[ChannelInfo]:
        """Every known channel with its ids (for ``shmbus stats`` and the Spark source)."""
        mm = self.mm
        now = time.time()
        tail = self.tail()
        for i in range(self.max_channels):
            off = self.table_off + i * SLOT_SIZE
            if self._u32[off >> 2] != SLOT_USED:
                continue
            nlen = self._u32[(off + 4) >> 2]
            if nlen > MAX_KEY_BYTES:
                continue  # being rewritten (or damaged): not a channel we can name
            key = bytes(mm[off + SLOT_HDR:off + SLOT_HDR + nlen])
            body = self._read_slot(off)
            if body is None:
                continue
            last_id, newest, trim_below, _since, ts, ttl = body
            expired = bool(last_id) and now - ts > ttl
            oldest = last_id + 1
            if newest and newest - 1 >= tail and not expired:
                _, _, oldest = self.channel_backlog(key, trim_below)
            yield ChannelInfo(key, 0 if expired else int(last_id), int(oldest), ts, expired)

    # ------------------------------------------------------------------ waiting
    def wait(self, seen_word: int, timeout: float) -> None:
        """Sleep until a publish after the caller read ``seen_word`` (or ``timeout`` seconds pass)."""
        self._lock()
        try:
            self._u32[_I_SLEEPERS] += 1
            self._set_proc_sleeping(1)
        finally:
            self._unlock()
        try:
            _native.futex_wait(self._futex_addr, seen_word, timeout)
        finally:
            self._lock()
            try:
                self._u32[_I_SLEEPERS] = max(self._u32[_I_SLEEPERS] - 1, 0)
                self._set_proc_sleeping(0)
            finally:
                self._unlock()

    def wake_all(self) -> None:
        """Bump the futex word and wake every sleeper (used by reset and shutdown)."""
        self._lock()
        try:
            self._u32[_I_FUTEX] = (self._u32[_I_FUTEX] + 1) & 0xFFFFFFFF
        finally:
            self._unlock()
        _native.futex_wake(self._futex_addr)

    # ------------------------------------------------------------------ process table
    def _register_process(self) -> None:
        pid = os.getpid()
        self._lock()
        try:
            u64 = self._u64
            head, tail = u64[_Q_HEAD], u64[_Q_TAIL]
            if tail > head or head - tail > self.ring_size or head % ALIGN or tail % ALIGN:
                raise SegmentCorrupt(f"{self.path}: commit state head={head} tail={tail} is impossible")
            if self._u32[_I_CHANNELS] > self.max_channels:
                raise SegmentCorrupt(f"{self.path}: {self._u32[_I_CHANNELS]} channels in a table of "
                                     f"{self.max_channels}")
            self._reap_dead_processes()
            for i in range(MAX_PROCS):
                off = _OFF_PROCS + i * _PROC_SIZE
                if self._u32[off >> 2] == 0:
                    self._buf[off + 8:off + 16] = struct.pack("<d", time.time())
                    self._u32[(off + 4) >> 2] = 0
                    self._u32[off >> 2] = pid
                    self._proc_index = i
                    break
        finally:
            self._unlock()

    def reregister_after_fork(self) -> None:
        """In a forked child: take a process-table slot of our own (the parent keeps its own)."""
        self._proc_index = -1
        self._register_process()

    def _unregister_process(self) -> None:
        if self._proc_index < 0:
            return
        self._lock()
        try:
            off = _OFF_PROCS + self._proc_index * _PROC_SIZE
            if self._u32[off >> 2] == os.getpid():
                self._u32[(off + 4) >> 2] = 0
                self._u32[off >> 2] = 0
            self._proc_index = -1
        finally:
            self._unlock()

    def _set_proc_sleeping(self, flag: int) -> None:
        if self._proc_index >= 0:
            off = _OFF_PROCS + self._proc_index * _PROC_SIZE
            if self._u32[off >> 2] == os.getpid():
                self._u32[(off + 4) >> 2] = flag

    def _reap_dead_processes(self) -> None:
        """Forget processes that died without detaching and recount sleepers (a dead sleeper left it high)."""
        sleepers = 0
        free = 0
        u32 = self._u32
        for i in range(MAX_PROCS):
            q = (_OFF_PROCS + i * _PROC_SIZE) >> 2
            pid, sleeping = u32[q], u32[q + 1]
            if pid == 0:
                free += 1
                continue
            if not _pid_alive(pid):
                u32[q + 1] = 0
                u32[q] = 0
                free += 1
            elif sleeping:
                sleepers += 1
        # With the table full, some processes may have no slot (their sleep is counted but not flagged): only
        # recount when every process could have registered, or a wake-up could be skipped.
        if u32[_I_SLEEPERS] > sleepers and free > 0:
            u32[_I_SLEEPERS] = sleepers

    def processes(self) -> list[int]:
        pids = []
        for i in range(MAX_PROCS):
            pid = self._u32[(_OFF_PROCS + i * _PROC_SIZE) >> 2]
            if pid and _pid_alive(pid):
                pids.append(pid)
        return pids

    # ------------------------------------------------------------------ admin
    def reset(self) -> int:
        """Empty the bus and give it a new epoch (clients see ids restart); returns the new epoch."""
        self._lock()
        try:
            u64, u32 = self._u64, self._u32
            epoch = secrets.randbits(63) or 1
            u64[_Q_TABLE_GEN] += 1  # first: readers holding slot numbers re-check the table
            u64[_Q_HEAD] = 0  # nothing is visible any more
            u64[_Q_TAIL] = 0
            u64[_Q_GID] = 0
            u64[_Q_EPOCH] = epoch
            u64[_Q_OVERWRITTEN] = 0
            u64[_Q_REPAIRS] = 0
            u32[_I_CHANNELS] = 0
            self._buf[self.table_off:self.ring_off] = bytes(self.ring_off - self.table_off)
            self._slot_cache.clear()
            self.epoch = epoch
            u32[_I_FUTEX] = (u32[_I_FUTEX] + 1) & 0xFFFFFFFF
        finally:
            self._unlock()
        _native.futex_wake(self._futex_addr)
        return epoch

    def stats(self) -> SegmentStats:
        u64 = self._u64
        self._lock()
        try:
            self._reap_dead_processes()
        finally:
            self._unlock()
        gid, head, tail = u64[_Q_GID], u64[_Q_HEAD], u64[_Q_TAIL]
        published = gid  # global ids are contiguous from 1 since creation or the last reset
        oldest_rec = self.global_backlog(0, limit=1) if head > tail else []
        oldest_gid = oldest_rec[0].global_id if oldest_rec else gid + 1
        history = time.time() - oldest_rec[0].timestamp if oldest_rec else 0.0
        return SegmentStats(
            name=self.name, path=self.path, epoch=self.read_epoch(), size=len(self.mm), ring_size=self.ring_size,
            max_channels=self.max_channels, channels=self._u32[_I_CHANNELS], global_id=gid,
            head=head, tail=tail, oldest_global_id=oldest_gid, published=published,
            overwritten=u64[_Q_OVERWRITTEN], repairs=u64[_Q_REPAIRS], ring_used=min(head - tail, self.ring_size),
            history_seconds=history, processes=self.processes(), sleepers=self._u32[_I_SLEEPERS],
            created_at=self.created_at)

    # ------------------------------------------------------------------ testing
    def _kill_after_store(self, k: int) -> None:
        """Test hook: SIGKILL this process right after its ``k``-th store to the segment from now on.

        Every store of :meth:`append` goes through ``_buf``/``_u64``/``_u32``; these are swapped for counting
        proxies, so a test can kill a writer after each single store of a publish and check what repair makes of
        it. Never used outside tests.
        """
        counter = [0]

        class _Counting:
            def __init__(self, view: Any) -> None:
                self._view = view

            def __getitem__(self, index: Any) -> Any:
                return self._view[index]

            def __setitem__(self, index: Any, value: Any) -> None:
                self._view[index] = value
                counter[0] += 1
                if counter[0] >= k:
                    os.kill(os.getpid(), signal.SIGKILL)

        self._buf = _Counting(self._buf)
        self._u64 = _Counting(self._u64)
        self._u32 = _Counting(self._u32)


def _check_ownership(st: os.stat_result, fpath: str, mode: int) -> None:
    """Refuse a segment another user could have planted or can tamper with (see :meth:`Segment.open`)."""
    euid = os.geteuid()
    group_ok = bool(mode & 0o070) and (st.st_gid == os.getegid() or st.st_gid in os.getgroups())
    if st.st_uid not in (euid, 0) and not group_ok:
        try:
            import pwd

            owner = pwd.getpwuid(st.st_uid).pw_name
        except (KeyError, ImportError):
            owner = str(st.st_uid)
        raise UnsafeSegment(
            f"{fpath} belongs to {owner} (uid {st.st_uid}), not to this user (uid {euid}): a segment planted by "
            "another user could read targeted messages and inject forged ones. If it is yours to use, run as its "
            f"owner (sudo -u {owner} ...), or share it on purpose with a group: Bus(..., mode=0o660) in every "
            "process of that group; otherwise remove it")
    extra = st.st_mode & 0o077 & ~mode
    if extra:
        raise UnsafeSegment(
            f"{fpath} has mode {stat.S_IMODE(st.st_mode):04o}, which lets "
            f"{'other users' if extra & 0o007 else 'its group'} {'write' if extra & 0o022 else 'read'} it "
            f"(this process allows {mode:04o}). chmod it, or pass a "
            "matching mode= to share the bus with a group on purpose")


def _validate_header(mm: mmap.mmap, fpath: str, size: int, check_ownership: Callable[[], None]) -> None:
    """Check every static header field against the file before anything is derived from it.

    What the file is (magic, layout version) is said first; then whether it may be trusted (``check_ownership``);
    then whether it is whole.
    """
    (magic, version, hsize, epoch, _created, ring_off, ring_size, table_off, max_channels, slot_size, procs_off,
     max_procs, ready, codec) = _H_STATIC.unpack_from(mm, 0)
    if magic != MAGIC:
        raise NotASegment(f"{fpath} exists but is not a shmbus segment (bad magic {magic!r})")
    if version != LAYOUT_VERSION:
        raise LayoutMismatch(
            f"{fpath} has layout version {version}, this shmbus writes {LAYOUT_VERSION}; "
            "stop every process using it and run `shmbus destroy --bus NAME` (or use another bus name)")
    check_ownership()
    if ready != READY:
        raise NotASegment(f"{fpath}: initialisation never finished (its creator died?); destroy it")
    problems = []
    if hsize != HEADER_SIZE or slot_size != SLOT_SIZE or procs_off != _OFF_PROCS or max_procs != MAX_PROCS:
        problems.append(f"header layout fields {hsize}/{slot_size}/{procs_off}/{max_procs}")
    if table_off != HEADER_SIZE or not 16 <= max_channels <= 1 << 22:
        problems.append(f"channel table at {table_off} with {max_channels} slots")
    elif ring_off != HEADER_SIZE + _table_bytes(max_channels):
        problems.append(f"ring at {ring_off}, expected {HEADER_SIZE + _table_bytes(max_channels)}")
    if ring_size < MIN_RING or ring_size % 4096:
        problems.append(f"ring size {ring_size}")
    if ring_off + ring_size != size:
        problems.append(f"size {size} does not match ring {ring_off}+{ring_size}")
    if not epoch or epoch >= 1 << 63:
        problems.append(f"epoch {epoch}")
    if not codec.rstrip(b"\x00").isascii():
        problems.append(f"codec name {codec!r}")
    if problems:
        raise SegmentCorrupt(f"{fpath}: damaged or foreign segment header: {'; '.join(problems)}")


def _reinitialize_after_reboot(mm: mmap.mmap) -> None:
    """A file-backed log from before a reboot: its mutex and futex still name dead threads. Re-make them."""
    anchor = ctypes.c_char.from_buffer(mm)
    try:
        _native.RobustMutex.initialize(ctypes.addressof(anchor) + _OFF_MUTEX)
    finally:
        del anchor
    _U32.pack_into(mm, _OFF_SLEEPERS, 0)
    mm[_OFF_PROCS:_OFF_PROCS + MAX_PROCS * _PROC_SIZE] = bytes(MAX_PROCS * _PROC_SIZE)
    mm[_OFF_BOOT:_OFF_BOOT + 16] = _boot_id()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
