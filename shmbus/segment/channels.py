"""The channel table: one slot per (channel, site), a seqlock over two copies of its state, and the per-channel
backward chains through the ring."""

from __future__ import annotations

import mmap
import struct
import time
import zlib
from collections.abc import Iterator

import posix_ipc

from ..errors import (
    ChannelTableFull,
    SegmentCorrupt,
)
from . import layout
from .layout import (
    _I_CHANNELS,
    _OFF_SLOT_COPY,
    _OFF_SLOT_VERSION,
    _Q_EPOCH,
    _Q_FLAGS,
    _Q_HEAD,
    _Q_TABLE_GEN,
    _Q_TAIL,
    _ZERO_COPIES,
    DEFAULT_LOCK_TIMEOUT,
    FLAG_SPARSE_IDS,
    KIND_MSG,
    MAX_KEY_BYTES,
    REC_HDR,
    SLOT_EMPTY,
    SLOT_HDR,
    SLOT_SIZE,
    SLOT_TOMBSTONE,
    SLOT_USED,
    ChannelInfo,
    Record,
)
from .ring import Ring

# Struct objects are assigned, not imported by name: see the note on the formats in layout.py.
_REC, _SLOT_BODY, _SLOT_KEY = layout._REC, layout._SLOT_BODY, layout._SLOT_KEY


class ChannelTable(Ring):
    """Part of :class:`~shmbus.segment.Segment`: the channel table, read lock-free (a chain walk stops where the
    ring lapped it: :class:`Ring`), and this process's cache of where each channel's slot is."""

    def __init__(
        self,
        name: str,
        fd: int,
        mm: mmap.mmap,
        path: str,
        owner_shm: posix_ipc.SharedMemory | None,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    ) -> None:
        super().__init__(name, fd, mm, path, owner_shm, lock_timeout)
        self._slot_cache: dict[bytes, int] = {}  # key -> byte offset of its slot (valid for _table_gen)
        self._table_gen = -1

    # ------------------------------------------------------------------ channel table
    def _find_slot(self, key: bytes, *, insert: bool, now: float = 0.0, tail: int = 0) -> int:
        """Byte offset of ``key``'s slot (caller holds the lock when ``insert``); -1 when absent and not inserting."""
        mm, slots, base = self.mm, self.max_channels, self.table_off
        key_hash = zlib.crc32(key)
        i = key_hash % slots
        first_free = -1
        key_len = len(key)
        for _ in range(slots):
            off = base + i * SLOT_SIZE
            state, name_len, slot_hash = _SLOT_KEY.unpack_from(mm, off)
            if state == SLOT_EMPTY:
                if first_free < 0:
                    first_free = i
                break
            if state == SLOT_TOMBSTONE:
                if first_free < 0:
                    first_free = i
            elif slot_hash == key_hash and name_len == key_len and mm[off + SLOT_HDR : off + SLOT_HDR + key_len] == key:
                self._slot_cache[key] = off
                return off
            i = (i + 1) % slots
        if not insert:
            return -1
        used = self._u32[_I_CHANNELS]
        if first_free < 0 or used >= slots * 9 // 10:
            victim = self._evict(now, tail)
            if first_free < 0:
                first_free = victim
        off = base + first_free * SLOT_SIZE
        buf = self._buf
        # Fill the slot while its state still says free, then publish it with one store of the state word.
        buf[off + SLOT_HDR : off + SLOT_HDR + key_len] = key
        buf[off + 4 : off + 16] = struct.pack("<IQ", key_len, key_hash)
        buf[off + _OFF_SLOT_COPY : off + _OFF_SLOT_COPY + len(_ZERO_COPIES)] = _ZERO_COPIES
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
                "create the bus with a larger max_channels"
            )
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
        version_index = (off + _OFF_SLOT_VERSION) >> 3
        base = off + _OFF_SLOT_COPY
        size = _SLOT_BODY.size
        for attempt in range(1 << 20):
            gen = u64[_Q_TABLE_GEN]
            version = u64[version_index]
            body = _SLOT_BODY.unpack_from(mm, base + (version & 1) * size)
            if body[1] and body[1] - 1 >= u64[_Q_HEAD]:  # that publish has not committed: the state before it
                body = _SLOT_BODY.unpack_from(mm, base + ((version - 1) & 1) * size)
            if u64[version_index] == version:
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
        self,
        key: bytes,
        after_id: int,
        *,
        upto: int | None = None,
        limit: int | None = None,
        keep_newest: int | None = None,
    ) -> tuple[list[Record], int, int]:
        """Retained records of one channel with ``after_id < message_id <= upto``, oldest first.

        Returns ``(records, last_id, first_available)``. ``first_available`` is the oldest id still readable
        (``last_id + 1`` when none is); ``first_available > after_id + 1`` means the messages in between are gone
        (trimmed by the channel's backlog limit, or overwritten by the ring): reported, never a silent hole.
        The records' ``pos`` is -1 (not tracked for backlog reads). Built on :meth:`channel_columns`.
        ``keep_newest`` applies a backlog limit counted in messages (segments with sparse ids keep no id window):
        only the channel's newest ``keep_newest`` messages are readable, older ones count as trimmed.
        """
        mids, gids, stamps, payloads, metas, last_id, first = self.channel_columns(key, after_id, upto, keep_newest)
        channel, _, site = key.partition(b"$|$")
        n = len(mids) if limit is None else min(limit, len(mids))
        out = [Record(-1, gids[i], mids[i], stamps[i], channel, site, metas[i], payloads[i]) for i in range(n)]
        return out, last_id, first

    def channel_columns(
        self, key: bytes, after_id: int, upto: int | None = None, keep_newest: int | None = None
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
            result = self._walk_channel(key, after_id, upto, keep_newest)
            if self._u64[_Q_EPOCH] == epoch:
                return result
        raise SegmentCorrupt(f"{self.path}: the bus kept being reset during a backlog read")

    def _walk_channel(
        self, key: bytes, after_id: int, upto: int | None, keep_newest: int | None = None
    ) -> tuple[list[int], list[int], list[float], list[bytes], list[bytes], int, int]:
        last_id, newest, trim_below, since_gid = self.channel_state(key)
        lowest = max(after_id, trim_below)
        highest = last_id if upto is None else min(upto, last_id)
        mm, ring, base, u64 = self.mm, self.ring_size, self.ring_off, self._u64
        channel, _, site = key.partition(b"$|$")
        key_channel_len, key_site_len = len(channel), len(site)
        unpack = _REC.unpack_from
        mids: list[int] = []
        gids: list[int] = []
        stamps: list[float] = []
        payloads: list[bytes] = []
        metas: list[bytes] = []
        reached = last_id + 1
        pos = newest - 1
        above_pos, above_mid, above_gid = 1 << 63, last_id + 1, 1 << 64
        counted = 0
        overwritten = False
        while pos >= 0:
            if u64[_Q_TAIL] > pos:
                overwritten = True
                break  # overwritten: this and everything older is gone (reached stays at the oldest one read)
            off = pos % ring
            start = base + off
            if off + REC_HDR > ring and self._bad_record(pos, "a message header would cross the end of the ring"):
                break
            length, kind, gid, mid, prev, ts, channel_len, site_len, meta_len, payload_len = unpack(mm, start)
            payload = meta = b""
            sane = (
                kind == KIND_MSG
                and off + length <= ring
                and REC_HDR + channel_len + site_len + meta_len + payload_len + 4 <= length
                and channel_len == key_channel_len
                and site_len == key_site_len
            )
            if sane and lowest < mid <= highest and gid >= since_gid:
                fields_start = start + REC_HDR + channel_len + site_len
                meta = mm[fields_start : fields_start + meta_len] if meta_len else b""
                payload = mm[fields_start + meta_len : fields_start + meta_len + payload_len]
            if u64[_Q_TAIL] > pos:
                overwritten = True
                break  # the copy may be torn: drop it, and everything older is gone
            # Committed and not overwritten: the record is exactly what its writer wrote. Trust it only if sane.
            if not sane or not (pos < above_pos and mid < above_mid and gid < above_gid and prev - 1 < pos):
                raise SegmentCorrupt(
                    f"{self.path}: channel {key!r} chain broken at position {pos} (kind {kind}, id {mid}, "
                    f"global id {gid}, previous at {prev - 1})"
                )
            if mid <= lowest or gid < since_gid:
                reached = lowest + 1
                break
            counted += 1
            if keep_newest is not None and counted > keep_newest:
                reached = mid + 1  # the newest message beyond the count limit: it and all older are trimmed
                break
            reached = mid
            if mid <= highest:
                mids.append(mid)
                gids.append(gid)
                stamps.append(ts)
                payloads.append(payload)
                metas.append(meta)
            above_pos, above_mid, above_gid = pos, mid, gid
            pos = prev - 1
        for col in (mids, gids, stamps, payloads, metas):
            col.reverse()
        if overwritten and u64[_Q_FLAGS] & FLAG_SPARSE_IDS:
            # Sparse ids: the lost predecessor's id is unknown, but it is older than everything the ring holds,
            # so a client at or past the ring's oldest global id (message ids are global ids) missed nothing.
            reached = min(reached, self.oldest_global_id())
        return mids, gids, stamps, payloads, metas, last_id, max(reached, 1) if last_id > after_id else after_id + 1

    def iter_channels(self) -> Iterator[ChannelInfo]:
        """Every known channel with its ids (for ``shmbus stats`` and the Spark source)."""
        mm = self.mm
        now = time.time()
        tail = self.tail()
        for i in range(self.max_channels):
            off = self.table_off + i * SLOT_SIZE
            if self._u32[off >> 2] != SLOT_USED:
                continue
            name_len = self._u32[(off + 4) >> 2]
            if name_len > MAX_KEY_BYTES:
                continue  # being rewritten (or damaged): not a channel we can name
            key = bytes(mm[off + SLOT_HDR : off + SLOT_HDR + name_len])
            body = self._read_slot(off)
            if body is None:
                continue
            last_id, newest, trim_below, _since, ts, ttl = body
            expired = bool(last_id) and now - ts > ttl
            oldest = last_id + 1
            if newest and newest - 1 >= tail and not expired:
                _, _, oldest = self.channel_backlog(key, trim_below)
            yield ChannelInfo(key, 0 if expired else int(last_id), int(oldest), ts, expired)
