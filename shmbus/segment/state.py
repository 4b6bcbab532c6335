"""What every part of :class:`~shmbus.segment.Segment` shares: the mapping, its typed views, the mutex."""

from __future__ import annotations

import ctypes
import functools
import mmap
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import posix_ipc

from .. import _native
from . import layout
from .layout import (
    _OFF_FUTEX,
    _OFF_MUTEX,
    _Q_FLAGS,
    DEFAULT_LOCK_TIMEOUT,
    FLAG_METRICS,
    METRICS_SIZE,
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
    """The state of one attached segment, declared once so every part of :class:`Segment` is checked against it."""

    # from the header, fixed for the segment's life
    epoch: int
    created_at: float
    ring_off: int
    ring_size: int
    table_off: int
    max_channels: int
    if TYPE_CHECKING:  # provided by the other parts of Segment, which use each other's through these

        def _lock(self) -> None: ...
        def _repair(self) -> None: ...
        def _interrupted_locking(self) -> None: ...
        def _reset_stores(self) -> int: ...
        def _find_slot(self, key: bytes, *, insert: bool, now: float = 0.0, tail: int = 0) -> int: ...
        def _bad_record(self, pos: int, what: str) -> bool: ...
        def tail(self) -> int: ...
        def oldest_global_id(self) -> int: ...
        def bridge_refusal(self) -> str: ...

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
        self._slot_cache: dict[bytes, int] = {}  # key -> byte offset of its slot (valid for _table_gen)
        self._table_gen = -1
        self._proc_index = -1
        self._closed = False
        flags = self._u64[_Q_FLAGS]
        end = self.ring_off + self.ring_size
        #: byte offset of the metrics area (:data:`~.layout.FLAG_METRICS`), -1 in a segment without one
        self.metrics_off = end if flags & FLAG_METRICS and len(mm) >= end + METRICS_SIZE else -1
        self._metrics_base = -1  # word index of this process's metrics slot
        self._pub_word = 0  # word indexes of this process's publish / relay counters (0: not counting)
        self._relay_word = 0
        #: (futex word, pid) this process is counted among the sleepers for (see Processes.wait). Added as a 30th
        #: attribute, it made every publish run 1% more instructions on CPython 3.11 (perf/ab_lock.py: the append's
        #: attribute loads), so the file descriptor and the shm object share one attribute, _handles.
        self._counted_for: tuple[int, int] | None = None
