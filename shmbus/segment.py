"""The shared-memory segment: a crash-safe global log of variable-length records plus a channel index.

Layout (all integers little-endian)::

    [0, 4096)            header: magic, layout version, epoch, sizes, robust mutex, commit state, futex word,
                         process table
    [4096, T)            channel table: ``max_channels`` slots of 256 bytes (name, last id, newest record, limits)
    [T, T + ring_size)   the ring: records ``[hdr 52 B][channel][site][meta][payload][pad][footer u32]``,
                         16-byte aligned, never wrapping (a PAD record fills the end of the ring instead)

Positions are absolute byte offsets that only grow (``pos % ring_size`` is the place in the ring), so a reader
knows it was lapped when ``tail > pos``. Writers hold the robust mutex; readers never lock:

* a record is visible once ``head`` moves past it (``head`` is stored last, a single aligned 8-byte store);
* before overwriting old records a writer first advances ``tail``; a reader copies a record, then re-reads
  ``tail``: if it moved past the record, the copy may be torn and is dropped (and reported as lost);
* a writer killed at any point leaves ``head`` untouched, so nothing half-written is visible; the next locker gets
  ``EOWNERDEAD`` and repairs the channel slots that point past ``head``.

Per channel, records are chained backwards (``prev``), so reading a channel's backlog costs O(messages returned).
This relies on x86-64's store ordering (TSO) for lock-free readers; see the README's limitations.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import mmap
import os
import secrets
import struct
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import posix_ipc

from . import _native
from .errors import ChannelTableFull, LayoutMismatch, NotASegment, PayloadTooLarge, UnsupportedPlatform

__all__ = ["Record", "Segment", "SegmentStats", "segment_path"]

MAGIC = b"shmbus\x00\x01"
LAYOUT_VERSION = 1
HEADER_SIZE = 4096
SLOT_SIZE = 256
SLOT_HDR = 64
MAX_KEY_BYTES = SLOT_SIZE - SLOT_HDR  # channel + "$|$" + site, UTF-8
MAX_PROCS = 128
ALIGN = 16
READY = 0x52454459  # "REDY"

# header fields
_H_STATIC = struct.Struct("<8sIIQdQQQIIQII16s")  # magic..codec, at 0
_OFF_READY = 76
_OFF_MUTEX = 128
_OFF_HEAD = 192
_OFF_GID = 200
_OFF_TAIL = 208
_OFF_TABLE_GEN = 216
_OFF_PUBLISHED = 224  # reserved (the count equals global_id, so it is no longer written on publish)
_OFF_OVERWRITTEN = 232
_OFF_REPAIRS = 240
_OFF_FUTEX = 256
_OFF_SLEEPERS = 260
_OFF_CHANNELS = 264
_OFF_LAST_TS = 272
_OFF_BOOT = 280  # 16 bytes of the boot id: kernel objects (mutex, futex) must be re-made after a reboot
_OFF_PROCS = 512  # MAX_PROCS x 16: pid u32, sleeping u32, attached_at f64

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_F64 = struct.Struct("<d")
_STATE = struct.Struct("<QQQQ")  # head, global_id, tail, table_gen
_PROC = struct.Struct("<IId")

# records
_REC = struct.Struct("<IIQQQdHHII")
REC_HDR = _REC.size  # 52
KIND_MSG = 1
KIND_PAD = 2
_PAD = struct.Struct("<II")
_WAKE = struct.Struct("<II")  # futex word, sleeper count (adjacent, read together)
_ZEROS = [bytes(n) for n in range(ALIGN)]

# channel slots
_SLOT = struct.Struct("<IIQQQQQdd")  # state, name_len, hash, last_id, newest(pos+1), trim_below, since_gid, ts, ttl
_OFF_SLOT_LAST = 16
_OFF_SLOT_NEWEST = 24
_OFF_SLOT_TRIM = 32
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


def _align(n: int) -> int:
    return (n + ALIGN - 1) & ~(ALIGN - 1)


class Segment:
    """One attached segment. Create or attach with :meth:`open`; all methods are thread-safe."""

    def __init__(self, name: str, fd: int, mm: mmap.mmap, path: str, owner_shm: posix_ipc.SharedMemory | None):
        self.name = name
        self.path = path
        self._fd = fd
        self._shm = owner_shm
        self.mm = mm
        (_magic, _version, _hsize, self.epoch, self.created_at, self.ring_off, self.ring_size, self.table_off,
         self.max_channels, _slot_size, _procs_off, _max_procs, _ready, _codec_raw) = _H_STATIC.unpack_from(mm, 0)
        self.codec_name = _codec_raw.rstrip(b"\x00").decode()
        self.max_record = self.ring_size // 4
        self._anchor = ctypes.c_char.from_buffer(mm)
        base = ctypes.addressof(self._anchor)
        self._futex_addr = base + _OFF_FUTEX
        self.mutex = _native.RobustMutex(base + _OFF_MUTEX)
        self._mutex_ptr = ctypes.c_void_p(base + _OFF_MUTEX)
        self._slot_cache: dict[bytes, int] = {}
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
    ) -> Segment:
        """Attach to segment ``name``, creating and initialising it if it does not exist yet.

        ``path`` maps a regular file instead (the log then survives restarts and, once written back, reboots).
        Sizes only apply when this call creates the segment; an existing segment keeps its own.
        """
        if not _native.supported():
            raise UnsupportedPlatform("shmbus needs Linux with glibc (robust mutexes, futexes)")
        if ring_size < 64 << 10 or ring_size % 4096:
            raise ValueError("ring_size must be a multiple of 4096 and at least 64 KiB")
        if not 16 <= max_channels <= 1 << 22:
            raise ValueError("max_channels must be between 16 and 4194304")
        shm = None
        if path is None:
            flags = posix_ipc.O_CREAT if create else 0
            try:
                shm = posix_ipc.SharedMemory(f"/shmbus.{name}", flags, mode=0o600)
            except posix_ipc.ExistentialError:
                raise FileNotFoundError(f"no shmbus segment named {name!r} ({segment_path(name)})") from None
            fd = shm.fd
            fpath = segment_path(name)
        else:
            fd = os.open(path, (os.O_CREAT if create else 0) | os.O_RDWR, 0o600)
            fpath = path
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # serialises initialisation between racing creators/attachers
            try:
                size = os.fstat(fd).st_size
                if size == 0:
                    table_off = HEADER_SIZE
                    ring_off = HEADER_SIZE + ((max_channels * SLOT_SIZE + 4095) & ~4095)
                    total = ring_off + ring_size
                    os.ftruncate(fd, total)
                    mm = mmap.mmap(fd, total)
                    cls._initialize(mm, table_off, ring_off, ring_size, max_channels, codec_name)
                else:
                    if size < HEADER_SIZE:
                        raise NotASegment(f"{fpath} is {size} bytes: not a shmbus segment")
                    mm = mmap.mmap(fd, size)
                    cls._validate(mm, fpath, size)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        except BaseException:
            if shm is not None:
                shm.close_fd()
            else:
                os.close(fd)
            raise
        seg = cls(name, fd, mm, fpath, shm)
        seg._register_process()
        return seg

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

    @staticmethod
    def _validate(mm: mmap.mmap, fpath: str, size: int) -> None:
        magic, version = struct.unpack_from("<8sI", mm, 0)
        if magic != MAGIC:
            raise NotASegment(f"{fpath} exists but is not a shmbus segment (bad magic {magic!r})")
        if version != LAYOUT_VERSION:
            raise LayoutMismatch(
                f"{fpath} has layout version {version}, this shmbus writes {LAYOUT_VERSION}; "
                "stop every process using it and run `shmbus destroy NAME` (or use another bus name)")
        (_, _, _, _, _, ring_off, ring_size, _, _, _, _, _, ready, _) = _H_STATIC.unpack_from(mm, 0)
        if ring_off + ring_size != size:
            raise NotASegment(f"{fpath}: size {size} does not match its header (damaged or foreign file)")
        if ready != READY:
            raise NotASegment(f"{fpath}: initialisation never finished (its creator died?); destroy it")
        if bytes(mm[_OFF_BOOT:_OFF_BOOT + 16]) != _boot_id():
            # A file-backed log from before a reboot: the mutex and futex still name dead threads. Re-make them.
            anchor = ctypes.c_char.from_buffer(mm)
            try:
                _native.RobustMutex.initialize(ctypes.addressof(anchor) + _OFF_MUTEX)
            finally:
                del anchor
            _U32.pack_into(mm, _OFF_SLEEPERS, 0)
            mm[_OFF_PROCS:_OFF_PROCS + MAX_PROCS * _PROC.size] = bytes(MAX_PROCS * _PROC.size)
            mm[_OFF_BOOT:_OFF_BOOT + 16] = _boot_id()

    def close(self) -> None:
        """Detach this process (the segment stays for the others)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self._unregister_process()
        del self._anchor
        self.mutex = None  # type: ignore[assignment]
        try:
            self.mm.close()
        except BufferError:  # a Record memoryview still alive somewhere; the mapping goes with the process
            pass
        if self._shm is not None:
            self._shm.close_fd()
        else:
            os.close(self._fd)

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
        if self.mutex.acquire():
            self._repair()

    def _repair(self) -> None:
        """Undo what a writer that died holding the lock left behind (called with the lock held).

        Records past ``head`` were never visible, so only channel slots can point at them: roll each such slot back
        to the record's predecessor. ``global_id`` is re-derived from the last committed record.
        """
        mm = self.mm
        head, gid, tail, _ = _STATE.unpack_from(mm, _OFF_HEAD)
        last_gid = self._last_committed_gid(head, tail)
        if last_gid is not None and last_gid != gid:
            _U64.pack_into(mm, _OFF_GID, last_gid)
        for i in range(self.max_channels):
            off = self.table_off + i * SLOT_SIZE
            state, _, _, last_id, newest = struct.unpack_from("<IIQQQ", mm, off)
            if state != SLOT_USED or newest == 0 or newest - 1 < head:
                continue
            # The dead writer updated this slot for a record it never committed: step back to its predecessor.
            rec = self._read_header(newest - 1)
            prev = rec[4] if rec is not None else 0
            mid = rec[3] if rec is not None else last_id
            struct.pack_into("<QQ", mm, off + _OFF_SLOT_LAST, max(mid - 1, 0), prev)
        _U64.pack_into(mm, _OFF_REPAIRS, _U64.unpack_from(mm, _OFF_REPAIRS)[0] + 1)
        self._bump_futex()
        self._slot_cache.clear()

    def _last_committed_gid(self, head: int, tail: int) -> int | None:
        if head <= tail:
            return None
        ring, base = self.ring_size, self.ring_off
        end = head
        while end > tail:
            foot_off = base + ((end - 1) % ring) - 3
            (length,) = _U32.unpack_from(self.mm, foot_off)
            if length < ALIGN or length > ring:
                return None
            start = end - length
            kind = _U32.unpack_from(self.mm, base + start % ring + 4)[0]
            if kind == KIND_MSG:
                return int(_U64.unpack_from(self.mm, base + start % ring + 8)[0])
            end = start
        return None

    def _bump_futex(self) -> None:
        mm = self.mm
        _U32.pack_into(mm, _OFF_FUTEX, (_U32.unpack_from(mm, _OFF_FUTEX)[0] + 1) & 0xFFFFFFFF)

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

        ``global_id``/``message_id`` impose externally assigned ids (the Redis bridge): a record whose global id
        is not above the segment's is skipped and ``(0, 0)`` returned, so replays are idempotent. An imposed
        ``message_id`` that does not follow the channel's last id starts a new chain (older ids are reported as a
        gap, not silently missing). ``expect_global_id`` skips the append (``(0, 0)``) unless the segment's global
        id is exactly that value, checked under the lock (a publisher may then append its own message without
        creating a hole the relay would never fill).
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
        mm = self.mm
        ring = self.ring_size
        sleepers = 0
        if _native.mutex_lock(self._mutex_ptr):  # EOWNERDEAD: the previous writer died holding the lock
            self._repair()
        try:
            head, gid, tail, table_gen = _STATE.unpack_from(mm, _OFF_HEAD)
            if expect_global_id is not None and gid != expect_global_id:
                return 0, 0
            if table_gen != self._table_gen:
                self._slot_cache.clear()
                self._table_gen = table_gen
            slot = self._slot_cache.get(key)
            if slot is None:
                slot = self._find_slot(key, insert=True, now=ts, tail=tail)
            soff = self.table_off + slot * SLOT_SIZE
            last_id, newest, trim_below, since_gid, last_ts, ttl = _SLOT_BODY6.unpack_from(mm, soff + 16)
            if last_id and ts - last_ts > ttl:  # expired like the gem's Redis TTL: ids restart at 1
                last_id = newest = trim_below = 0
            if global_id is None:
                new_gid = gid + 1
            elif global_id <= gid:
                return 0, 0
            else:
                new_gid = global_id
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
                _PAD.pack_into(mm, self.ring_off + off, pad, KIND_PAD)
                _U32.pack_into(mm, self.ring_off + ring - 4, pad)
                pos += pad
                off = 0
            elif pos + rec_len - ring > tail:
                tail = self._advance_tail(tail, pos + rec_len - ring, head)
            start = self.ring_off + off
            mm[start:start + rec_len] = b"".join((
                _REC.pack(rec_len, KIND_MSG, new_gid, new_mid, newest, ts, len(channel), len(site), len(meta),
                          len(payload)),
                channel, site, meta, payload, _ZEROS[rec_len - total], _U32.pack(rec_len)))
            if clear_every <= 1 or new_mid % clear_every == 0:
                trim_below = max(trim_below, new_mid - max_backlog_size)
            _SLOT_BODY6.pack_into(mm, soff + 16, new_mid, pos + 1, trim_below, since_gid, ts, max_backlog_age)
            _U64.pack_into(mm, _OFF_GID, new_gid)
            _U64.pack_into(mm, _OFF_HEAD, pos + rec_len)  # the commit
            word, sleepers = _WAKE.unpack_from(mm, _OFF_FUTEX)
            _U32.pack_into(mm, _OFF_FUTEX, (word + 1) & 0xFFFFFFFF)
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
            if length < ALIGN or length > ring:  # cannot happen in a consistent ring; never loop forever
                tail = head
                break
            if kind == KIND_MSG:
                dropped += 1
            tail += length
        if tail < need:
            tail = need  # the ring was empty up to here (e.g. right after a reset)
        _U64.pack_into(mm, _OFF_TAIL, tail)
        if dropped:
            _U64.pack_into(mm, _OFF_OVERWRITTEN, _U64.unpack_from(mm, _OFF_OVERWRITTEN)[0] + dropped)
        return tail

    # ------------------------------------------------------------------ channel table
    def _find_slot(self, key: bytes, *, insert: bool, now: float = 0.0, tail: int = 0) -> int:
        """Index of ``key``'s slot (caller holds the lock when ``insert``); -1 when absent and not inserting."""
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
                self._slot_cache[key] = i
                return i
            i = (i + 1) % n
        if not insert:
            return -1
        used = _U32.unpack_from(mm, _OFF_CHANNELS)[0]
        if first_free < 0 or used >= n * 9 // 10:
            victim = self._evict(now, tail)
            if first_free < 0:
                first_free = victim
        off = base + first_free * SLOT_SIZE
        mm[off:off + SLOT_SIZE] = bytes(SLOT_SIZE)
        mm[off + SLOT_HDR:off + SLOT_HDR + klen] = key
        _SLOT_KEY.pack_into(mm, off, SLOT_USED, klen, h)
        _U32.pack_into(mm, _OFF_CHANNELS, _U32.unpack_from(mm, _OFF_CHANNELS)[0] + 1)
        self._slot_cache[key] = first_free
        return first_free

    def _evict(self, now: float, tail: int) -> int:
        """Free the least recently published slot whose messages are all gone (expired or overwritten)."""
        mm, base = self.mm, self.table_off
        best, best_ts = -1, float("inf")
        for i in range(self.max_channels):
            off = base + i * SLOT_SIZE
            state, _, _, last_id, newest, _, _, ts, ttl = _SLOT.unpack_from(mm, off)
            if state != SLOT_USED:
                continue
            expired = last_id and now - ts > ttl
            if (expired or newest == 0 or newest - 1 < tail) and ts < best_ts:
                best, best_ts = i, ts
        if best < 0:
            raise ChannelTableFull(
                f"all {self.max_channels} channel slots hold channels with retained messages; "
                "create the bus with a larger max_channels")
        off = base + best * SLOT_SIZE
        _U32.pack_into(mm, off, SLOT_TOMBSTONE)
        _U32.pack_into(mm, _OFF_CHANNELS, _U32.unpack_from(mm, _OFF_CHANNELS)[0] - 1)
        _U64.pack_into(mm, _OFF_TABLE_GEN, _U64.unpack_from(mm, _OFF_TABLE_GEN)[0] + 1)
        self._slot_cache.clear()
        return best

    def _lookup(self, key: bytes) -> int:
        gen = _U64.unpack_from(self.mm, _OFF_TABLE_GEN)[0]
        if gen != self._table_gen:
            self._slot_cache.clear()
            self._table_gen = gen
        slot = self._slot_cache.get(key)
        if slot is None:
            slot = self._find_slot(key, insert=False)
        return slot

    # ------------------------------------------------------------------ reading (lock-free)
    def head(self) -> int:
        return int(_U64.unpack_from(self.mm, _OFF_HEAD)[0])

    def tail(self) -> int:
        return int(_U64.unpack_from(self.mm, _OFF_TAIL)[0])

    def global_id(self) -> int:
        return int(_U64.unpack_from(self.mm, _OFF_GID)[0])

    def read_epoch(self) -> int:
        return int(_U64.unpack_from(self.mm, 16)[0])

    def futex_word(self) -> int:
        return int(_U32.unpack_from(self.mm, _OFF_FUTEX)[0])

    def _read_header(self, pos: int) -> tuple[int, ...] | None:
        if pos < self.tail():
            return None
        hdr = _REC.unpack_from(self.mm, self.ring_off + pos % self.ring_size)
        if pos < self.tail() or hdr[1] != KIND_MSG:
            return None
        return hdr

    def read_since(self, pos: int, limit: int = 4096) -> tuple[list[Record], int, bool]:
        """Records committed at or after ``pos`` (the listener's cursor).

        Returns ``(records, next_pos, lost)`` where ``lost`` is True when the ring overwrote records before they
        were read (the cursor then jumps to ``tail``; compare global ids to count them).
        """
        mm, ring, base = self.mm, self.ring_size, self.ring_off
        head, _, tail, _ = _STATE.unpack_from(mm, _OFF_HEAD)
        lost = False
        if pos < tail:
            lost = True
            pos = tail
        out: list[Record] = []
        unpack = _REC.unpack_from
        while pos < head and len(out) < limit:
            start = base + pos % ring
            length, kind, gid, mid, _prev, ts, cl, sl, ml, pl = unpack(mm, start)
            if length < ALIGN or length > ring:
                break  # torn: we were lapped mid-read; the tail check below resynchronises
            if kind == KIND_MSG:
                b = start + REC_HDR
                raw = mm[b:b + cl + sl + ml + pl]
                out.append(Record(pos, gid, mid, ts, raw[:cl], raw[cl:cl + sl], raw[cl + sl:cl + sl + ml],
                                  raw[cl + sl + ml:]))
            pos += length
        tail = _U64.unpack_from(mm, _OFF_TAIL)[0]
        if out and out[0].pos < tail:
            kept = [r for r in out if r.pos >= tail]
            lost = True
            out = kept
            if pos < tail:
                pos = tail
        return out, pos, lost

    def channel_state(self, key: bytes) -> tuple[int, int, int, int]:
        """``(last_id, newest_pos_plus_1, trim_below, since_gid)`` of a channel, honouring expiry; zeros if unknown.

        ``last_id`` is taken from the newest committed record when it is still in the ring (that read cannot be
        torn), else from the slot.
        """
        slot = self._lookup(key)
        if slot < 0:
            return 0, 0, 0, 0
        mm = self.mm
        off = self.table_off + slot * SLOT_SIZE
        head = _U64.unpack_from(mm, _OFF_HEAD)[0]
        newest = _U64.unpack_from(mm, off + _OFF_SLOT_NEWEST)[0]
        last_id, _n, trim_below, since_gid, ts, ttl = _SLOT_BODY6.unpack_from(mm, off + 16)
        if last_id and time.time() - ts > ttl:
            return 0, 0, 0, 0
        if newest:
            pos = newest - 1
            hdr = self._read_header(pos) if pos >= 0 else None
            if hdr is not None and pos >= head:  # committed? not yet: use its predecessor
                newest = hdr[4]
                last_id = hdr[3] - 1
            elif hdr is not None:
                last_id = hdr[3]
        return int(last_id), int(newest), int(trim_below), int(since_gid)

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
        chain back from its newest record, copies only payload and meta bytes, and skips records above ``upto``.
        """
        last_id, newest, trim_below, since_gid = self.channel_state(key)
        lowest = max(after_id, trim_below)
        hi = last_id if upto is None else min(upto, last_id)
        mm, ring, base, max_record = self.mm, self.ring_size, self.ring_off, self.max_record
        unpack, tail_of = _REC.unpack_from, _U64.unpack_from
        mids: list[int] = []
        gids: list[int] = []
        stamps: list[float] = []
        payloads: list[bytes] = []
        metas: list[bytes] = []
        reached = last_id + 1
        pos = newest - 1
        while pos >= 0:
            start = base + pos % ring
            length, kind, gid, mid, prev, ts, cl, sl, ml, pl = unpack(mm, start)
            if kind != KIND_MSG or length > max_record:
                break  # overwritten: everything older is gone too
            if mid <= lowest or gid < since_gid:
                reached = lowest + 1
                break
            if mid <= hi:
                p = start + REC_HDR + cl + sl
                meta = mm[p:p + ml] if ml else b""
                payload = mm[p + ml:p + ml + pl]
            if tail_of(mm, _OFF_TAIL)[0] > pos:
                break  # the copy may be torn: drop it, and everything older is gone
            reached = mid
            if mid <= hi:
                mids.append(mid)
                gids.append(gid)
                stamps.append(ts)
                payloads.append(payload)
                metas.append(meta)
            pos = prev - 1
        for col in (mids, gids, stamps, payloads, metas):
            col.reverse()
        return mids, gids, stamps, payloads, metas, last_id, max(reached, 1) if last_id > after_id else after_id + 1

    def global_backlog(self, after_gid: int, limit: int | None = None) -> list[Record]:
        """Committed records with global id greater than ``after_gid``, oldest first (walks back from head)."""
        mm, ring, base = self.mm, self.ring_size, self.ring_off
        head, _, tail, _ = _STATE.unpack_from(mm, _OFF_HEAD)
        start = head
        while start > tail:
            (length,) = _U32.unpack_from(mm, base + (start - 1) % ring - 3)
            if length < ALIGN or length > ring or start - length < tail:
                break
            p = start - length
            kind, gid = struct.unpack_from("<IQ", mm, base + p % ring + 4)
            if kind == KIND_MSG and gid <= after_gid:
                break
            start = p
        records, _, _ = self.read_since(start, limit=limit or (1 << 62))
        return [r for r in records if r.global_id > after_gid]

    def iter_channels(self) -> Iterator[ChannelInfo]:
        """Every known channel with its ids (for ``shmbus stats`` and the Spark source)."""
        mm = self.mm
        now = time.time()
        tail = self.tail()
        for i in range(self.max_channels):
            off = self.table_off + i * SLOT_SIZE
            state, nlen, _, last_id, newest, trim_below, _since, ts, ttl = _SLOT.unpack_from(mm, off)
            if state != SLOT_USED:
                continue
            key = bytes(mm[off + SLOT_HDR:off + SLOT_HDR + nlen])
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
            _U32.pack_into(self.mm, _OFF_SLEEPERS, _U32.unpack_from(self.mm, _OFF_SLEEPERS)[0] + 1)
            self._set_proc_sleeping(1)
        finally:
            self.mutex.release()
        try:
            _native.futex_wait(self._futex_addr, seen_word, timeout)
        finally:
            self._lock()
            try:
                n = _U32.unpack_from(self.mm, _OFF_SLEEPERS)[0]
                _U32.pack_into(self.mm, _OFF_SLEEPERS, max(n - 1, 0))
                self._set_proc_sleeping(0)
            finally:
                self.mutex.release()

    def wake_all(self) -> None:
        """Bump the futex word and wake every sleeper (used by reset and shutdown)."""
        self._lock()
        try:
            self._bump_futex()
        finally:
            self.mutex.release()
        _native.futex_wake(self._futex_addr)

    # ------------------------------------------------------------------ process table
    def _register_process(self) -> None:
        pid = os.getpid()
        self._lock()
        try:
            self._reap_dead_processes()
            for i in range(MAX_PROCS):
                off = _OFF_PROCS + i * _PROC.size
                if _PROC.unpack_from(self.mm, off)[0] == 0:
                    _PROC.pack_into(self.mm, off, pid, 0, time.time())
                    self._proc_index = i
                    break
        finally:
            self.mutex.release()

    def reregister_after_fork(self) -> None:
        """In a forked child: take a process-table slot of our own (the parent keeps its own)."""
        self._proc_index = -1
        self._register_process()

    def _unregister_process(self) -> None:
        if self._proc_index < 0:
            return
        self._lock()
        try:
            off = _OFF_PROCS + self._proc_index * _PROC.size
            if _PROC.unpack_from(self.mm, off)[0] == os.getpid():
                _PROC.pack_into(self.mm, off, 0, 0, 0.0)
            self._proc_index = -1
        finally:
            self.mutex.release()

    def _set_proc_sleeping(self, flag: int) -> None:
        if self._proc_index >= 0:
            off = _OFF_PROCS + self._proc_index * _PROC.size
            if _U32.unpack_from(self.mm, off)[0] == os.getpid():
                _U32.pack_into(self.mm, off + 4, flag)

    def _reap_dead_processes(self) -> None:
        """Forget processes that died without detaching and recount sleepers (a dead sleeper left it high)."""
        sleepers = 0
        free = 0
        for i in range(MAX_PROCS):
            off = _OFF_PROCS + i * _PROC.size
            pid, sleeping, _ = _PROC.unpack_from(self.mm, off)
            if pid == 0:
                free += 1
                continue
            if not _pid_alive(pid):
                _PROC.pack_into(self.mm, off, 0, 0, 0.0)
                free += 1
            elif sleeping:
                sleepers += 1
        cur = _U32.unpack_from(self.mm, _OFF_SLEEPERS)[0]
        # With the table full, some processes may have no slot (their sleep is counted but not flagged): only
        # recount when every process could have registered, or a wake-up could be skipped.
        if cur > sleepers and free > 0:
            _U32.pack_into(self.mm, _OFF_SLEEPERS, sleepers)

    def processes(self) -> list[int]:
        pids = []
        for i in range(MAX_PROCS):
            pid = _PROC.unpack_from(self.mm, _OFF_PROCS + i * _PROC.size)[0]
            if pid and _pid_alive(pid):
                pids.append(pid)
        return pids

    # ------------------------------------------------------------------ admin
    def reset(self) -> int:
        """Empty the bus and give it a new epoch (clients see ids restart); returns the new epoch."""
        self._lock()
        try:
            epoch = secrets.randbits(63) or 1
            mm = self.mm
            _U64.pack_into(mm, 16, epoch)
            _STATE.pack_into(mm, _OFF_HEAD, 0, 0, 0, _U64.unpack_from(mm, _OFF_TABLE_GEN)[0] + 1)
            struct.pack_into("<QQQ", mm, _OFF_PUBLISHED, 0, 0, 0)
            _U32.pack_into(mm, _OFF_CHANNELS, 0)
            mm[self.table_off:self.ring_off] = bytes(self.ring_off - self.table_off)
            self._slot_cache.clear()
            self.epoch = epoch
            self._bump_futex()
        finally:
            self.mutex.release()
        _native.futex_wake(self._futex_addr)
        return epoch

    def stats(self) -> SegmentStats:
        mm = self.mm
        self._lock()
        try:
            self._reap_dead_processes()
        finally:
            self.mutex.release()
        head, gid, tail, _ = _STATE.unpack_from(mm, _OFF_HEAD)
        _, overwritten, repairs = struct.unpack_from("<QQQ", mm, _OFF_PUBLISHED)
        published = gid  # global ids are contiguous from 1 since creation or the last reset
        oldest_rec = self.global_backlog(0, limit=1) if head > tail else []
        oldest_gid = oldest_rec[0].global_id if oldest_rec else gid + 1
        history = time.time() - oldest_rec[0].timestamp if oldest_rec else 0.0
        return SegmentStats(
            name=self.name, path=self.path, epoch=self.read_epoch(), size=len(mm), ring_size=self.ring_size,
            max_channels=self.max_channels, channels=_U32.unpack_from(mm, _OFF_CHANNELS)[0], global_id=gid,
            head=head, tail=tail, oldest_global_id=oldest_gid, published=published, overwritten=overwritten,
            repairs=repairs, ring_used=min(head - tail, self.ring_size), history_seconds=history,
            processes=self.processes(), sleepers=_U32.unpack_from(mm, _OFF_SLEEPERS)[0],
            created_at=self.created_at)


_SLOT_KEY = struct.Struct("<IIQ")
_SLOT_BODY6 = struct.Struct("<QQQQdd")  # last_id, newest, trim_below, since_gid, ts, ttl (at slot + 16)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
