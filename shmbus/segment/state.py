"""What every part of :class:`~shmbus.segment.Segment` stands on: the mapping, its typed views, the mutex.

The parts are layers, one module each, each a class whose bases are exactly the parts it uses, so mypy checks
every use of another part against that part's own definition (no part declares another's names)::

    SegmentState                     the mapping, its views, the header's sizes, the mutex and futex    (state)
    Ring(SegmentState)               lock-free reads: records, the commit state, the global backlog     (ring)
    ChannelTable(Ring)               the table, its seqlocked slots, the chains; the slot cache         (channels)
    Locking(ChannelTable)            the robust mutex; repair (which fixes slots, finishes a reset)     (locking)
    Processes(Locking)               futex waits, the process table, the metrics slot and counters      (processes)
    Bridging(Locking)                the bridge record, the history identity, the chain barrier         (bridging)
    Writing(Processes, Bridging)     the append: the lock, a slot, this process's counter, the refusal  (writing)
    Segment(Writing)                 open, close, reset, stats                                          (core)

A part with state of its own sets it in its ``__init__`` after ``super().__init__`` (:class:`ChannelTable` its
slot cache, :class:`Processes` its process-table and metrics words); this class holds only what every part reads.
A layer uses what it stands on directly (the append reads the slot cache and the counter words inline: a call
would cost every publish). All of it is one class in one MRO, so the publish and read paths run the same
``self.x`` loads, on one instance dict, as a single class would.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
from collections.abc import Callable
from typing import Protocol

import posix_ipc

from .. import _native
from . import layout
from .layout import (
    _OFF_FUTEX,
    _OFF_MUTEX,
    DEFAULT_LOCK_TIMEOUT,
)

# Struct objects are assigned, not imported by name: see the note on the formats in layout.py.
_H_STATIC = layout._H_STATIC


class Words(Protocol):
    """A typed view of the mapping (``"Q"`` or ``"I"``): one aligned load or store per item."""

    def __getitem__(self, index: int, /) -> int: ...
    def __setitem__(self, index: int, value: int, /) -> None: ...


class Bytes(Protocol):
    """Byte-range stores into the mapping."""

    def __setitem__(self, index: slice, value: bytes | bytearray, /) -> None: ...


class SegmentState:
    """The mapping of one attached segment and what every part reads of it (the base of every part)."""

    # from the header, fixed for the segment's life
    epoch: int
    created_at: float
    ring_off: int
    ring_size: int
    table_off: int
    max_channels: int

    def __init__(
        self,
        name: str,
        fd: int,
        mm: mmap.mmap,
        path: str,
        owner_shm: posix_ipc.SharedMemory | None,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    ):
        self.name = name
        self.path = path
        self._handles = (fd, owner_shm)  # closed together (one attribute: see _counted_for)
        self.mm = mm
        self.lock_timeout = lock_timeout
        (
            _magic,
            _version,
            _hsize,
            self.epoch,
            self.created_at,
            self.ring_off,
            self.ring_size,
            self.table_off,
            self.max_channels,
            _slot_size,
            _procs_off,
            _max_procs,
            _ready,
            _codec_raw,
        ) = _H_STATIC.unpack_from(mm, 0)
        self.codec_name = _codec_raw.rstrip(b"\x00").decode("ascii", "replace")
        self.max_record = self.ring_size // 4
        # Every store of the append path goes through _buf (byte ranges, the mapping itself: slice assignment on
        # an mmap is cheaper than on a memoryview), _u64 or _u32 (single aligned stores); see _kill_after_store.
        self._buf: Bytes = mm
        view = memoryview(mm)
        self._u64: Words = view.cast("Q")
        self._u32: Words = view.cast("I")
        view.release()
        self._anchor = ctypes.c_char.from_buffer(mm)
        base = ctypes.addressof(self._anchor)
        self._futex_addr = base + _OFF_FUTEX
        mutex_ptr = ctypes.c_void_p(base + _OFF_MUTEX)
        # Release the writers' lock (see Locking): the C call itself, so nothing runs between a ``finally`` and it.
        # (In the place of an unused ``mutex`` attribute: with one more attribute, or another order, the append's
        # ``self.x`` loads cost more, up to 1.2% more instructions per publish on CPython 3.11.)
        self._unlock: Callable[[], int] = functools.partial(_native.mutex_unlock, mutex_ptr)
        self._mutex_ptr = mutex_ptr
        self._closed = False  # detached (Segment.close): the parts that write on their own (metrics) check it
