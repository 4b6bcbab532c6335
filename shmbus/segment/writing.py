"""Appending to the ring, under the writers' lock, in the commit order that lets readers go without it."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

from .. import _native
from ..errors import (
    BusBridged,
    ChannelTableFull,
    PayloadTooLarge,
    SegmentCorrupt,
)
from . import layout
from .bridging import Bridging
from .layout import (
    _BODY,
    _I_FUTEX,
    _I_SLEEPERS,
    _OFF_FUTEX,
    _OFF_HEAD,
    _OFF_SLOT_COPY,
    _OFF_SLOT_VERSION,
    _Q_GID,
    _Q_HEAD,
    _Q_OVERWRITTEN,
    _Q_REPAIR_DUE,
    _Q_TAIL,
    _ZEROS,
    ALIGN,
    FLAG_BRIDGED,
    FLAG_SPARSE_IDS,
    KIND_MSG,
    KIND_PAD,
    MAX_KEY_BYTES,
    REC_HDR,
    REPAIR_DUE,
)
from .processes import Processes

# Struct objects are assigned, not imported by name: see the note on the formats in layout.py.
_APPEND_STATE, _IDS, _PAD, _REC, _SLOT_BODY, _U32, _WAKE = (
    layout._APPEND_STATE,
    layout._IDS,
    layout._PAD,
    layout._REC,
    layout._SLOT_BODY,
    layout._U32,
    layout._WAKE,
)
_JOIN = bytearray().join  # a new bytearray of the parts (the separator, empty, is never changed)


# How far an append got, for its exception handler: taking the lock (and repairing), holding it with nothing
# stored yet, storing (a store may be half done: the next holder repairs).
_LOCKING, _HELD, _STORING = 0, 1, 2


class Writing(Processes, Bridging):
    """Part of :class:`~shmbus.segment.Segment`: the append. It stands on every other part: the lock and its
    repair, the channel table, this process's counters (:class:`Processes`) and the bridge's refusal."""

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
        reported as a gap, not silently missing) — unless the segment has sparse ids (``FLAG_SPARSE_IDS``: the
        message id is the global id), where any higher id continues the chain. ``expect_global_id`` skips the
        append (``(0, 0)``) unless the segment's global id is exactly that value, checked under the lock (a
        publisher may then append its own message without creating a hole the relay would never fill).
        """
        key = channel + b"$|$" + site if site else channel
        if len(key) > MAX_KEY_BYTES:
            raise ValueError(f"channel plus site id is {len(key)} bytes; the limit is {MAX_KEY_BYTES}")
        total = REC_HDR + len(channel) + len(site) + len(meta) + len(payload) + 4
        rec_len = (total + 15) & ~15
        if rec_len > self.max_record:
            raise self._too_large(channel, rec_len)
        ts = time.time() if timestamp is None else timestamp
        # The whole record is built before the lock (every other writer waits while it is held): under it, only
        # its ids and its predecessor's position are filled in (_IDS), and it is copied into the ring in one store.
        record = _JOIN(
            (
                _REC.pack(rec_len, KIND_MSG, 0, 0, 0, ts, len(channel), len(site), len(meta), len(payload)),
                channel,
                site,
                meta,
                payload,
                _ZEROS[rec_len - total],
                _U32.pack(rec_len),
            )
        )
        # the channel's slot as this process knew it, valid while the table is at that generation (checked under
        # the lock): the generation first, since another thread may clear the cache and move it meanwhile
        seen_gen = self._table_gen
        slot_offset = self._slot_cache.get(key)
        ring = self.ring_size
        # Python may raise between any two calls here (a signal handler, an async exception): the lock is taken
        # inside the try, whose finally releases it whatever happened (harmless when this thread does not hold it),
        # and ``stage`` tells the handler what such an exception may have left (see Locking).
        stage = _LOCKING
        try:
            if _native.mutex_lock(self._mutex_ptr, self.lock_timeout):  # EOWNERDEAD: the last writer died holding it
                self._repair()
            # Under the lock no other writer runs, so the fields only writers change can be read in bulk with
            # struct; every store below that a reader may race with is a single typed-view store.
            mm, u64 = self.mm, self._u64
            head, gid, tail, table_gen, due, flags, barrier = _APPEND_STATE.unpack_from(mm, _OFF_HEAD)
            if due:  # a holder an exception stopped left a repair due
                self._repair()
                head, gid, tail, table_gen, due, flags, barrier = _APPEND_STATE.unpack_from(mm, _OFF_HEAD)
            stage = _HELD
            if expect_global_id is not None and gid != expect_global_id:
                return 0, 0
            if global_id is None:
                if flags & FLAG_BRIDGED:  # a local id here would be one the backend gives another message
                    raise BusBridged(self.bridge_refusal())
                new_gid = gid + 1
            elif global_id <= gid:
                return 0, 0
            else:
                new_gid = global_id
            if table_gen != seen_gen:  # the table changed since that lookup (here or in another thread): again
                if table_gen != self._table_gen:
                    self._slot_cache.clear()
                    self._table_gen = table_gen
                slot_offset = self._slot_cache.get(key)
            stage = _STORING  # from here on a store may be half done
            if slot_offset is None:
                slot_offset = self._find_slot(key, insert=True, now=ts, tail=tail)
            version = u64[(slot_offset + _OFF_SLOT_VERSION) >> 3]
            copy = slot_offset + _OFF_SLOT_COPY + (version & 1) * _BODY
            last_id, newest, trim_below, since_gid, last_ts, ttl = _SLOT_BODY.unpack_from(mm, copy)
            if last_id and ts - last_ts > ttl:  # expired like the gem's Redis TTL: ids restart at 1
                last_id = newest = trim_below = 0
            new_mid = last_id + 1 if message_id is None else message_id
            sparse = flags & FLAG_SPARSE_IDS
            # with sparse ids a chain goes on across a forward jump, unless the bridge lost messages since the
            # channel's last one (the barrier): then the next read across it must report a gap
            if last_id == 0 or (new_mid != last_id + 1 and not (sparse and new_mid > last_id > barrier)):
                since_gid = new_gid
                newest = 0
                trim_below = max(new_mid - 1, 0) if message_id is not None else 0
            off = head % ring
            if off + rec_len > ring:  # a PAD record fills the ring's end
                tail = self._advance_tail(tail, head + ring - off + rec_len - ring, head)
                self._pad(off)
                head += ring - off
                off = 0
            elif head + rec_len - ring > tail:  # a full ring (every append, once it is): free the oldest records
                # (_advance_tail's loop, inlined: a call costs more than the one record it usually frees)
                need, dropped, base = head + rec_len - ring, 0, self.ring_off
                while tail < need:  # need < head: no record past head is read
                    length, kind = _PAD.unpack_from(mm, base + tail % ring)
                    if length < ALIGN or length % ALIGN or length > ring - tail % ring:
                        raise SegmentCorrupt(f"{self.path}: record at {tail} has length {length}")
                    if kind == KIND_MSG:
                        dropped += 1
                    tail += length
                u64[_Q_TAIL] = tail  # before any byte is overwritten
                u64[_Q_OVERWRITTEN] = u64[_Q_OVERWRITTEN] + dropped
            _IDS.pack_into(record, 8, new_gid, new_mid, newest)
            start = self.ring_off + off
            self._buf[start : start + rec_len] = record
            # (sparse ids: the limit is a count, applied by readers)
            if (
                not sparse
                and (clear_every <= 1 or new_mid % clear_every == 0)
                and new_mid - max_backlog_size > trim_below
            ):
                trim_below = new_mid - max_backlog_size
            other = copy + _BODY if version & 1 == 0 else copy - _BODY  # the copy no reader is told to read
            self._buf[other : other + _BODY] = _SLOT_BODY.pack(
                new_mid, head + 1, trim_below, since_gid, ts, max_backlog_age
            )
            u64[(slot_offset + _OFF_SLOT_VERSION) >> 3] = version + 1
            u64[_Q_HEAD] = head + rec_len  # the commit
            u64[_Q_GID] = new_gid
            # this process's metrics slot (shmbus.metrics), exact as it is counted under the lock: a publish, or a
            # relay's store (a bridge's publisher storing its own message, expect_global_id, is counted by the bus).
            # Spelled for the fewest bytecodes on the publish path ("x[i] += 1" costs a third more than this).
            counter = self._pub_word if global_id is None else self._relay_word if expect_global_id is None else 0
            if counter:
                u64[counter] = u64[counter] + 1
            word, sleepers = _WAKE.unpack_from(mm, _OFF_FUTEX)
            u32 = self._u32
            u32[_I_FUTEX] = (word + 1) & 0xFFFFFFFF
            if sleepers:  # wake them, then take them off the count, still under the lock (see Processes.wait)
                _native.futex_wake(self._futex_addr)
                u32[_I_SLEEPERS] = 0
        except ChannelTableFull:  # raised before the slot search stores anything: nothing to repair
            raise
        except BaseException:
            # No call before the store below: one would give a second exception a place to land.
            if stage == _STORING:  # held since the lock's repair ran
                self._u64[_Q_REPAIR_DUE] |= REPAIR_DUE
            elif stage == _LOCKING:
                self._interrupted_locking()
            raise
        finally:
            _native.mutex_unlock(self._mutex_ptr)
        return new_gid, new_mid

    def _pad(self, off: int) -> None:
        """A PAD record from ``off`` to the ring's end (its header and its footer: two stores)."""
        pad = self.ring_size - off
        start = self.ring_off + off
        self._buf[start : start + 8] = _PAD.pack(pad, KIND_PAD)
        end = self.ring_off + self.ring_size
        self._buf[end - 4 : end] = _U32.pack(pad)

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

    def check_fits(self, channel: bytes, site: bytes, payload: bytes, meta: bytes = b"") -> None:
        """Raise :class:`PayloadTooLarge` as :meth:`append` would: for an engine, before its backend takes a
        message no segment could store (it would be acknowledged and stored nowhere)."""
        rec_len = (REC_HDR + len(channel) + len(site) + len(meta) + len(payload) + 4 + 15) & ~15
        if rec_len > self.max_record:
            raise self._too_large(channel, rec_len)

    def _too_large(self, channel: bytes, rec_len: int) -> PayloadTooLarge:
        return PayloadTooLarge(
            f"message on {channel.decode(errors='replace')!r} is {rec_len} bytes encoded; "
            f"this bus accepts at most {self.max_record} (a quarter of ring_size={self.ring_size})"
        )

    # ------------------------------------------------------------------ testing
    def _kill_after_store(self, k: int) -> None:
        """Test hook: SIGKILL this process right after its ``k``-th store to the segment from now on."""
        self._after_store(k, lambda: os.kill(os.getpid(), signal.SIGKILL))

    def _after_store(self, k: int, action: Callable[[], object]) -> None:
        """Test hook: run ``action`` (kill this process, raise) right after its ``k``-th store to the segment from
        now on, once.

        Every store of :meth:`append` goes through ``_buf``/``_u64``/``_u32``; these are swapped for counting
        proxies, so a test can stop a writer after each single store of a publish and check what repair makes of
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
                if counter[0] == k:
                    action()

        self._buf = _Counting(self._buf)
        self._u64 = _Counting(self._u64)
        self._u32 = _Counting(self._u32)
