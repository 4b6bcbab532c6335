"""The segment's layout: sizes, offsets and record formats, the result types, and the checks an attach makes."""

from __future__ import annotations

import ctypes
import enum
import mmap
import os
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from .. import _native
from ..errors import (
    LayoutMismatch,
    NotASegment,
    SegmentCorrupt,
    UnsafeSegment,
)

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
_OFF_REPAIR_DUE = 248  # u64 of REPAIR_* bits: what a holder interrupted by an exception left for the next to finish
_OFF_FUTEX = 256
_OFF_SLEEPERS = 260
_OFF_CHANNELS = 264
_OFF_BOOT = 280  # 16 bytes of the boot id: kernel objects (mutex, futex) must be re-made after a reboot
_OFF_FLAGS = 296  # u64 of FLAG_* bits; zero in segments made before it existed
_OFF_HISTORY = 304  # u64: the bridge backend's history identity the segment holds (0: none recorded)
_OFF_CHAIN_BARRIER = 312  # u64: with sparse ids, a channel whose last id is at or below it starts a new chain
_OFF_BRIDGE = 3072  # the bridge record (after the process table): u32 length, then UTF-8 JSON; zero: none
_BRIDGE_MAX = HEADER_SIZE - _OFF_BRIDGE - 4
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
_Q_REPAIR_DUE = _OFF_REPAIR_DUE >> 3
_Q_FLAGS = _OFF_FLAGS >> 3
_Q_HISTORY = _OFF_HISTORY >> 3
_Q_CHAIN_BARRIER = _OFF_CHAIN_BARRIER >> 3

#: Message ids are the engine's global ids (PostgreSQL): a channel's ids have gaps, and its backlog limit is a
#: count of messages, not a window of ids. Set by such an engine; survives resets.
FLAG_SPARSE_IDS = 1
#: The segment ends with a metrics area (``METRICS_SIZE`` bytes after the ring): per-process counters that any
#: process may read (:mod:`shmbus.metrics`). Segments made before it existed have no such area and no figures.
FLAG_METRICS = 2
#: A bridge engine (Redis, PostgreSQL) assigns this segment's ids: an append without imposed ids would take an id
#: the backend later gives another message, so the segment refuses it (:class:`~shmbus.errors.BusBridged`). The
#: bridge record (``_OFF_BRIDGE``) says which engine and backend, without secrets. Set by the bridge; survives resets.
FLAG_BRIDGED = 4

# What the repair-due word (_OFF_REPAIR_DUE) asks of the next holder of the lock. A holder that an exception (a signal
# handler's, KeyboardInterrupt, an async exception) stops mid-way releases the lock like any other, so unlike a
# killed one it leaves no EOWNERDEAD behind: it sets a bit instead, under the lock, and the next holder repairs.
# Only holders write the word; zero in segments made before it existed (never used by layout version 2).
#: a store of an append (or a repair) may be half done: run the same repair as after a writer's death
REPAIR_DUE = 1
#: a reset was under way: finish it (an empty bus with a new epoch), since its half-done stores are no valid state
RESET_DUE = 2

# The metrics area: a header of retired totals (the counters of processes whose slot was taken over), then one
# slot per process-table entry. Every field is one aligned u64 (f64 bits for times), written only by the slot's
# process: readers never see a torn value.
METRICS_HEADER = 512
METRIC_SLOT = 128
METRICS_SIZE = METRICS_HEADER + MAX_PROCS * METRIC_SLOT
METRIC_FIELDS = (
    "pid",
    "started",  # f64: when the slot was claimed
    "updated",  # f64: the last flush
    "publishes",  # messages this process appended (counted in the append, under the segment's lock)
    "relayed",  # messages with engine-assigned ids this process stored (a bridge's relay)
    "deliveries",  # messages handed to clients (HTTP, SSE, WebSocket, guble) by this process
    "lost",  # messages this process's listener reports lost
    "parked",  # gauge: long polls waiting
    "streams",  # gauge: open streams (chunked HTTP, SSE, WebSocket)
    "listener_gid",  # the last global id this process's listener handled
    "relay",  # 1 while this process relays for a bridge engine
    "relay_state",  # index into shmbus.figures.RELAY_STATES: the bridge's relay state in this process
    "relay_highest",  # the backend's newest global id as the relay knows it, stored or not (lag = it - the segment's)
    "relay_lost",  # messages this process's relay found gone from the backend's backlog when catching up
)
RETIRED_FIELDS = ("publishes", "relayed", "deliveries", "lost", "relay_lost")
#: The metrics area's generation word (the header's last u64): a slot claim (under the segment's lock) makes it
#: odd, moves the old owner's counters to the retired totals, zeroes the slot, and makes it even again; a reader
#: that saw an odd value, or a change, read mid-claim and retries (a seqlock: writers never wait for readers).
METRICS_GEN_WORD = (METRICS_HEADER >> 3) - 1
_I_FUTEX = _OFF_FUTEX >> 2
_I_SLEEPERS = _OFF_SLEEPERS >> 2
_I_CHANNELS = _OFF_CHANNELS >> 2

# Record and slot formats. Modules that call their methods bind them by assignment (``_REC = layout._REC``), never
# ``from .layout import _REC``: CPython 3.11 compiles ``NAME.method(...)`` on a name bound by an import as an
# attribute load (a new bound method per call) instead of LOAD_METHOD, which made append 7% slower.

# records
_REC = struct.Struct("<IIQQQdHHII")  # length, kind, global id, message id, prev (pos+1), ts, lengths x4
REC_HDR = _REC.size  # 52
_IDS = struct.Struct("<QQQ")  # global id, message id, prev: the fields of _REC an append fills in under the lock
KIND_MSG = 1
KIND_PAD = 2
_PAD = struct.Struct("<II")
_U32 = struct.Struct("<I")
_STATE = struct.Struct("<QQQQ")  # head, global_id, tail, table_gen: read in bulk only under the lock
# The same four and the flags word (_OFF_FLAGS), in one unpack: the append needs the flags too, and a separate
# typed-view load of them costs more than the whole unpack.
# The chain barrier (right after the history word) and the repair-due word come with them, for the same reason.
_APPEND_STATE = struct.Struct(f"<QQQQ{_OFF_REPAIR_DUE - _OFF_HEAD - 32}xQ{_OFF_FLAGS - _OFF_REPAIR_DUE - 8}xQ8xQ")
_WAKE = struct.Struct("<II")  # futex word, sleeper count: likewise
_ZEROS = [bytes(n) for n in range(ALIGN)]

# channel slots: state u32, name_len u32, hash u64, version u64, reserved u64, copy 0 (48 B), copy 1 (48 B), name
_SLOT_KEY = struct.Struct("<IIQ")
_SLOT_BODY = struct.Struct("<QQQQdd")  # last_id, newest (pos+1), trim_below, since_gid, last publish ts, ttl
_BODY = _SLOT_BODY.size
_OFF_SLOT_VERSION = 16
_OFF_SLOT_COPY = 32
_ZERO_COPIES = bytes(2 * _SLOT_BODY.size)


class SlotState(enum.IntEnum):
    """A channel slot's state word (open addressing: a removed slot stays a tombstone so probes go on)."""

    EMPTY = 0
    USED = 1
    TOMBSTONE = 2


# plain aliases for the hot paths (one global load each)
SLOT_EMPTY = int(SlotState.EMPTY)
SLOT_USED = int(SlotState.USED)
SLOT_TOMBSTONE = int(SlotState.TOMBSTONE)

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


#: A record as :meth:`Segment.read_rows` returns it: a plain tuple of :class:`Record`'s fields, in its order
Row = tuple[int, int, int, float, bytes, bytes, bytes, bytes]


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
            "process of that group; otherwise remove it"
        )
    extra = st.st_mode & 0o077 & ~mode
    if extra:
        raise UnsafeSegment(
            f"{fpath} has mode {stat.S_IMODE(st.st_mode):04o}, which lets "
            f"{'other users' if extra & 0o007 else 'its group'} {'write' if extra & 0o022 else 'read'} it "
            f"(this process allows {mode:04o}). chmod it, or pass a "
            "matching mode= to share the bus with a group on purpose"
        )


def _validate_header(mm: mmap.mmap, fpath: str, size: int, check_ownership: Callable[[], None]) -> None:
    """Check every static header field against the file before anything is derived from it.

    What the file is (magic, layout version) is said first; then whether it may be trusted (``check_ownership``);
    then whether it is whole.
    """
    (
        magic,
        version,
        hsize,
        epoch,
        _created,
        ring_off,
        ring_size,
        table_off,
        max_channels,
        slot_size,
        procs_off,
        max_procs,
        ready,
        codec,
    ) = _H_STATIC.unpack_from(mm, 0)
    if magic != MAGIC:
        raise NotASegment(f"{fpath} exists but is not a shmbus segment (bad magic {magic!r})")
    if version != LAYOUT_VERSION:
        raise LayoutMismatch(
            f"{fpath} has layout version {version}, this shmbus writes {LAYOUT_VERSION}; "
            "stop every process using it and run `shmbus destroy --bus NAME` (or use another bus name)"
        )
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
    flags = struct.unpack_from("<Q", mm, _OFF_FLAGS)[0]
    extra = METRICS_SIZE if flags & FLAG_METRICS else 0
    if ring_off + ring_size + extra != size:
        problems.append(f"size {size} does not match ring {ring_off}+{ring_size} (+{extra} of metrics)")
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
    mm[_OFF_PROCS : _OFF_PROCS + MAX_PROCS * _PROC_SIZE] = bytes(MAX_PROCS * _PROC_SIZE)
    mm[_OFF_BOOT : _OFF_BOOT + 16] = _boot_id()


#: The highest pid Linux can hand out (``PID_MAX_LIMIT``, 2**22): a pid word above it, or 0, is damage.
PID_MAX = 1 << 22


def _pid_alive(pid: int) -> bool:
    """Is process ``pid`` alive? A pid no process can have (a damaged word: 0, beyond ``PID_MAX``, or one
    ``os.kill`` cannot even take) is not: it must never crash a reader."""
    if not 0 < pid <= PID_MAX:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, ValueError, OSError):
        return False
    return True


@dataclass
class Peek:
    """What the header of a segment file says, read without attaching (``shmbus list``, ``shmbus destroy``)."""

    size: int
    created_at: float
    processes: list[int]


def peek(path: str) -> Peek:
    """Read the header of the segment at ``path`` without mapping it, taking its lock or joining its process table
    (so listing buses never changes what their own ``stats`` show). Never follows a symbolic link.

    :class:`~shmbus.errors.NotASegment` when the file is not a regular file with a shmbus header,
    :class:`~shmbus.errors.LayoutMismatch` when another layout version wrote it; ``OSError`` when unreadable."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotASegment(f"{path!r} is not a regular file, so not a shmbus segment")
        head = os.pread(fd, HEADER_SIZE, 0) if st.st_size >= HEADER_SIZE else b""
    finally:
        os.close(fd)
    if len(head) < HEADER_SIZE or head[: len(MAGIC)] != MAGIC:
        raise NotASegment(f"{path!r} is not a shmbus segment (no shmbus header)")
    version = _U32.unpack_from(head, len(MAGIC))[0]
    if version != LAYOUT_VERSION:
        raise LayoutMismatch(f"{path!r} has layout version {version}, this shmbus reads {LAYOUT_VERSION}")
    created_at = _H_STATIC.unpack_from(head, 0)[4]
    pids = (_U32.unpack_from(head, _OFF_PROCS + i * _PROC_SIZE)[0] for i in range(MAX_PROCS))
    return Peek(st.st_size, created_at, [p for p in pids if _pid_alive(p)])
