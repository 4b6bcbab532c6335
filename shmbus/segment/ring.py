"""The ring: appending records (under the lock) and reading them (lock-free), with the commit order that makes
both safe."""

from __future__ import annotations

import os
import signal
import struct
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
from .layout import (
    _BODY,
    _I_FUTEX,
    _OFF_FUTEX,
    _OFF_HEAD,
    _OFF_SLOT_COPY,
    _OFF_SLOT_VERSION,
    _Q_EPOCH,
    _Q_FLAGS,
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
    Record,
)
from .state import SegmentState

# Struct objects are assigned, not imported by name: see the note on the formats in layout.py.
_APPEND_STATE, _PAD, _REC, _SLOT_BODY, _U32, _WAKE = (
    layout._APPEND_STATE,
    layout._PAD,
    layout._REC,
    layout._SLOT_BODY,
    layout._U32,
    layout._WAKE,
)


# How far an append got, for its exception handler: taking the lock (and repairing), holding it with nothing
# stored yet, storing (a store may be half done: the next holder repairs).
_LOCKING, _HELD, _STORING = 0, 1, 2


class Ring(SegmentState):
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
        body_pack = _SLOT_BODY.pack
        ring = self.ring_size
        sleepers = 0
        # Python may raise between any two calls here (a signal handler, an async exception): the lock is taken
        # inside the try, whose finally releases it whatever happened (harmless when this thread does not hold it),
        # and ``stage`` tells the handler what such an exception may have left (see Locking).
        stage = _LOCKING
        try:
            if _native.mutex_lock(self._mutex_ptr, self.lock_timeout):  # EOWNERDEAD: the last writer died holding it
                self._repair()
            # Under the lock no other writer runs, so the fields only writers change can be read in bulk with
            # struct; every store below that a reader may race with is a single typed-view store.
            mm, u64, buf = self.mm, self._u64, self._buf
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
            pos = head
            off = pos % ring
            if off + rec_len > ring:
                pad = ring - off
                tail = self._advance_tail(tail, pos + pad + rec_len - ring, head)
                start = self.ring_off + off
                buf[start : start + 8] = _PAD.pack(pad, KIND_PAD)
                buf[self.ring_off + ring - 4 : self.ring_off + ring] = _U32.pack(pad)
                pos += pad
                off = 0
            elif pos + rec_len - ring > tail:
                tail = self._advance_tail(tail, pos + rec_len - ring, head)
            start = self.ring_off + off
            buf[start : start + rec_len] = b"".join(
                (
                    _REC.pack(
                        rec_len,
                        KIND_MSG,
                        new_gid,
                        new_mid,
                        newest,
                        ts,
                        len(channel),
                        len(site),
                        len(meta),
                        len(payload),
                    ),
                    channel,
                    site,
                    meta,
                    payload,
                    _ZEROS[rec_len - total],
                    _U32.pack(rec_len),
                )
            )
            if not sparse and (clear_every <= 1 or new_mid % clear_every == 0):
                trim_below = max(trim_below, new_mid - max_backlog_size)  # sparse ids: a count, applied by readers
            other = copy + _BODY if version & 1 == 0 else copy - _BODY  # the copy no reader is told to read
            buf[other : other + _BODY] = body_pack(new_mid, pos + 1, trim_below, since_gid, ts, max_backlog_age)
            u64[(slot_offset + _OFF_SLOT_VERSION) >> 3] = version + 1
            u64[_Q_HEAD] = pos + rec_len  # the commit
            u64[_Q_GID] = new_gid
            # this process's metrics slot (shmbus.metrics), exact as it is counted under the lock: a publish, or a
            # relay's store (a bridge's publisher storing its own message, expect_global_id, is counted by the bus).
            # Spelled for the fewest bytecodes on the publish path ("x[i] += 1" costs a third more than this).
            counter = self._pub_word if global_id is None else self._relay_word if expect_global_id is None else 0
            if counter:
                u64[counter] = u64[counter] + 1
            word, sleepers = _WAKE.unpack_from(mm, _OFF_FUTEX)
            self._u32[_I_FUTEX] = (word + 1) & 0xFFFFFFFF
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

    # ------------------------------------------------------------------ reading (lock-free)
    def head(self) -> int:
        return int(self._u64[_Q_HEAD])

    def tail(self) -> int:
        return int(self._u64[_Q_TAIL])

    @property
    def sparse_ids(self) -> bool:
        """Are message ids the engine's global ids, with gaps within a channel (see ``FLAG_SPARSE_IDS``)?"""
        return bool(self._u64[_Q_FLAGS] & FLAG_SPARSE_IDS)

    def set_sparse_ids(self) -> None:
        """Mark the segment as holding sparse ids (once, by the engine that assigns them; never cleared)."""
        self._u64[_Q_FLAGS] |= FLAG_SPARSE_IDS

    def oldest_global_id(self) -> int:
        """The global id of the oldest record the ring still holds (``global_id() + 1`` when empty)."""
        # tail first: read head first, a reader paused while the ring laps would take a full ring for an empty one
        recs = self.global_backlog(0, limit=1) if self._u64[_Q_TAIL] < self._u64[_Q_HEAD] else []
        return recs[0].global_id if recs else self._u64[_Q_GID] + 1

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
                pos, f"length {length}, kind {kind}"
            ):
                break
            if kind == KIND_MSG:
                _, _, gid, mid, _prev, ts, channel_len, site_len, meta_len, payload_len = unpack(mm, start)
                if REC_HDR + channel_len + site_len + meta_len + payload_len + 4 > length and self._bad_record(
                    pos, f"fields of {channel_len + site_len + meta_len + payload_len} bytes in a {length}-byte record"
                ):
                    break
                fields_start = start + REC_HDR
                site_end = channel_len + site_len
                meta_end = site_end + meta_len
                raw = mm[fields_start : fields_start + meta_end + payload_len]
                out.append(
                    Record(
                        pos,
                        gid,
                        mid,
                        ts,
                        raw[:channel_len],
                        raw[channel_len:site_end],
                        raw[site_end:meta_end],
                        raw[meta_end:],
                    )
                )
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

    def global_backlog(self, after_gid: int, limit: int | None = None) -> list[Record]:
        """Committed records with global id greater than ``after_gid``, oldest first (walks back from head)."""
        mm, ring, base, u64 = self.mm, self.ring_size, self.ring_off, self._u64
        head, tail = u64[_Q_HEAD], u64[_Q_TAIL]
        start = head
        while start > tail:
            (length,) = _U32.unpack_from(mm, base + (start - 1) % ring - 3)
            if length < ALIGN or length % ALIGN or length > ring or start - length < tail:
                break
            record_start = start - length
            kind, gid = struct.unpack_from("<IQ", mm, base + record_start % ring + 4)
            if kind == KIND_MSG and gid <= after_gid:
                break
            start = record_start
        want = 1 << 62 if limit is None else limit
        if u64[_Q_TAIL] > start:  # the ring moved under the walk: its footers may be torn; start at tail
            start, want = u64[_Q_TAIL], 1 << 62
        records, _, _ = self.read_since(start, limit=want)
        records = [r for r in records if r.global_id > after_gid]
        return records if limit is None else records[:limit]

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
