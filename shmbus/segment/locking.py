"""The writers' robust mutex, and repair: what a writer killed mid-append leaves is made consistent again."""

from __future__ import annotations

import secrets
import struct

from .. import _native
from ..errors import (
    SegmentCorrupt,
)
from . import layout
from .channels import ChannelTable
from .layout import (
    _I_CHANNELS,
    _I_FUTEX,
    _OFF_SLOT_COPY,
    _OFF_SLOT_VERSION,
    _Q_CHAIN_BARRIER,
    _Q_EPOCH,
    _Q_GID,
    _Q_HEAD,
    _Q_OVERWRITTEN,
    _Q_REPAIR_DUE,
    _Q_REPAIRS,
    _Q_TABLE_GEN,
    _Q_TAIL,
    ALIGN,
    KIND_MSG,
    KIND_PAD,
    REPAIR_DUE,
    RESET_DUE,
    SLOT_SIZE,
    SLOT_USED,
)

# Struct objects are assigned, not imported by name: see the note on the formats in layout.py.
_PAD, _SLOT_BODY, _U32 = layout._PAD, layout._SLOT_BODY, layout._U32


class Locking(ChannelTable):
    """The lock every writer takes, and what makes it safe against death and against exceptions (part of
    :class:`~shmbus.segment.Segment`; the repair fixes the channel table, so it stands on :class:`ChannelTable`).

    Python may raise between any two calls (a signal handler's exception: SIGALRM timeouts, Celery's soft time
    limit, Ctrl-C; ``PyThreadState_SetAsyncExc`` in a thread). So a critical section is written
    ``try: self._lock(); ...; finally: self._unlock()``, the lock taken *inside* the ``try``: ``_unlock`` is
    harmless when this thread does not hold it, and is no Python function (where a signal handler could run at its
    start): the C unlock itself, bound to the mutex. A section its exception stops half way has its repair left due
    (``REPAIR_DUE``, set under the lock); the next holder repairs, as after a writer's death.
    """

    # ------------------------------------------------------------------ locking and repair
    def _lock(self) -> None:
        """Take the lock, repairing first what a holder that died or was interrupted left (call inside the try)."""
        try:
            if _native.mutex_lock(self._mutex_ptr, self.lock_timeout) or self._u64[_Q_REPAIR_DUE]:
                self._repair()
        except BaseException:
            self._interrupted_locking()
            raise

    def _interrupted_locking(self) -> None:
        """An exception escaped while the lock was being taken or repaired: if this thread holds it, the repair may
        not have run, or only part of it (it runs only once after a death): leave it due for the next holder."""
        if _native.mutex_settle(self._mutex_ptr):
            self._u64[_Q_REPAIR_DUE] |= REPAIR_DUE

    def _repair(self) -> None:
        """Undo what a writer that died, or that an exception stopped, left behind (called with the lock held).

        Only ``head`` makes a record visible, and every other store is either atomic or lands where no reader looks
        (past ``head``, or the inactive copy of a slot). So: a slot whose current copy names a record at or past
        ``head`` is flipped back (its other copy is the state before that publish); ``global_id`` (stored after
        ``head``) is re-derived from the newest committed record; the channel count is recounted. A reset that was
        stopped is finished instead. Every step may be repeated, so a repair that is itself stopped is run again
        by the next holder (the due word is cleared last).
        """
        u64, u32 = self._u64, self._u32
        if u64[_Q_REPAIR_DUE] & RESET_DUE:
            self._reset_stores()
            u64[_Q_REPAIRS] += 1
            u64[_Q_REPAIR_DUE] = 0
            return
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
        u64[_Q_REPAIR_DUE] = 0

    def _reset_stores(self) -> int:
        """The stores of a reset (under the lock; repeatable): an empty bus with a new epoch, which it returns."""
        u64, u32 = self._u64, self._u32
        epoch = secrets.randbits(63) or 1
        u64[_Q_TABLE_GEN] += 1  # first: readers holding slot numbers re-check the table
        u64[_Q_HEAD] = 0  # nothing is visible any more
        u64[_Q_TAIL] = 0
        u64[_Q_GID] = 0
        u64[_Q_EPOCH] = epoch
        u64[_Q_OVERWRITTEN] = 0
        u64[_Q_REPAIRS] = 0
        u64[_Q_CHAIN_BARRIER] = 0  # the flags, the bridge record and the history identity stay
        u32[_I_CHANNELS] = 0
        self._buf[self.table_off : self.ring_off] = bytes(self.ring_off - self.table_off)
        self._slot_cache.clear()
        self.epoch = epoch
        u32[_I_FUTEX] = (u32[_I_FUTEX] + 1) & 0xFFFFFFFF
        return epoch

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
