"""The ring read lock-free: records, the commit state, the global backlog (appending is in ``writing``)."""

from __future__ import annotations

import struct

from ..errors import SegmentCorrupt
from . import layout
from .layout import (
    _I_FUTEX,
    _Q_EPOCH,
    _Q_FLAGS,
    _Q_GID,
    _Q_HEAD,
    _Q_TAIL,
    ALIGN,
    FLAG_SPARSE_IDS,
    KIND_MSG,
    KIND_PAD,
    REC_HDR,
    Record,
    Row,
)
from .state import SegmentState

# Struct objects are assigned, not imported by name: see the note on the formats in layout.py.
_PAD, _REC, _U32 = layout._PAD, layout._REC, layout._U32
_new_tuple = tuple.__new__  # Record(*row) would run the named tuple's __new__, a Python function, per record


class Ring(SegmentState):
    """Part of :class:`~shmbus.segment.Segment`: the ring and the commit state, read without the lock."""

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
        rows, pos, lost = self.read_rows(pos, limit)
        return [_new_tuple(Record, row) for row in rows], pos, lost

    def read_rows(self, pos: int, limit: int = 4096) -> tuple[list[Row], int, bool]:
        """:meth:`read_since` as plain tuples in :class:`Record`'s field order: for the listener, which turns
        every record it reads into a message at once (a plain tuple costs a fraction of a named one to make and
        to unpack, and the listener pays that per delivery)."""
        mm, ring, base, u64 = self.mm, self.ring_size, self.ring_off, self._u64
        epoch = u64[_Q_EPOCH]
        head, tail = u64[_Q_HEAD], u64[_Q_TAIL]
        lost = False
        if pos < tail:
            lost = True
            pos = tail
        out: list[Row] = []
        append = out.append
        unpack, unpack_pad = _REC.unpack_from, _PAD.unpack_from
        last_header = ring - REC_HDR  # past this offset only a PAD record's header fits before the ring's end
        while pos < head and len(out) < limit:
            off = pos % ring
            start = base + off
            # one unpack of the whole header (a message's fields are used only once it proved to be one)
            if off <= last_header:
                length, kind, gid, mid, _prev, ts, channel_len, site_len, meta_len, payload_len = unpack(mm, start)
            else:
                length, kind = unpack_pad(mm, start)
            malformed = length < ALIGN or length % ALIGN or off + length > ring or kind not in (KIND_MSG, KIND_PAD)
            if (malformed or (kind == KIND_MSG and length < REC_HDR + 4)) and self._bad_record(
                pos, f"length {length}, kind {kind}"
            ):
                break
            if kind == KIND_MSG:  # a whole message header, then: off + length <= ring with length > REC_HDR
                if REC_HDR + channel_len + site_len + meta_len + payload_len + 4 > length and self._bad_record(
                    pos, f"fields of {channel_len + site_len + meta_len + payload_len} bytes in a {length}-byte record"
                ):
                    break
                # each field copied straight out of the mapping; the empty ones (site, meta, mostly) not at all
                at = start + REC_HDR
                end = at + channel_len
                channel = mm[at:end]
                site = meta = b""
                if site_len:
                    at, end = end, end + site_len
                    site = mm[at:end]
                if meta_len:
                    at, end = end, end + meta_len
                    meta = mm[at:end]
                append((pos, gid, mid, ts, channel, site, meta, mm[end : end + payload_len]))
            pos += length
        tail = u64[_Q_TAIL]
        if out and out[0][0] < tail:
            out = [r for r in out if r[0] >= tail]
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
