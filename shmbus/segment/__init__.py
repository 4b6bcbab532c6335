"""The shared-memory segment: a crash-safe global log of variable-length records plus a channel index.

Modules: ``layout`` (sizes, offsets, formats, attach checks), ``state`` (the mapping and its views), ``ring``
(lock-free reads), ``channels`` (the channel table and chains), ``locking`` (the robust mutex and crash repair),
``processes`` (futex wait/wake, the process table, metrics), ``bridging`` (the bridge record), ``writing`` (the
append), ``core`` (open, close, reset, stats). Each holds one layer of :class:`Segment`, a class whose bases are
the layers it uses (the order is in ``state``).

Layout (all integers little-endian, every mutable field naturally aligned)::

    [0, 4096)            header: magic, layout version, epoch, sizes, robust mutex, commit state, futex word,
                         process table
    [4096, T)            channel table: ``max_channels`` slots of 320 bytes (name, a version word and two copies
                         of the channel's state)
    [T, T + ring_size)   the ring: records ``[hdr 52 B][channel][site][meta][payload][pad][footer u32]``,
                         16-byte aligned, never wrapping (a PAD record fills the end of the ring instead)

Positions are absolute byte offsets that only grow (``pos % ring_size`` is the place in the ring), so a reader
knows it was lapped when ``tail > pos``. Writers hold the robust mutex; readers never lock. A writer builds its
record before it takes the mutex (every other writer waits while it is held): under it, the record's ids and its
predecessor's position are filled in and it is copied into the ring with one store.

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
of the append path (:meth:`Segment._kill_after_store`, in :mod:`.writing`) and verifies from a fresh process.

Per channel, records are chained backwards (``prev``), so reading a channel's backlog costs O(messages returned);
the walk checks ``tail`` before trusting a record and refuses a chain that does not strictly descend
(:class:`~shmbus.errors.SegmentCorrupt`), so a damaged segment can neither loop a reader nor hide a gap.
"""

from __future__ import annotations

from .bridging import BridgeRecord
from .core import Segment
from .layout import (
    DEFAULT_LOCK_TIMEOUT,
    LAYOUT_VERSION,
    MAX_KEY_BYTES,
    MIN_RING,
    ChannelInfo,
    Record,
    Row,
    SegmentStats,
    SlotState,
    peek,
    segment_path,
)

__all__ = [
    "BridgeRecord",
    "DEFAULT_LOCK_TIMEOUT",
    "LAYOUT_VERSION",
    "MAX_KEY_BYTES",
    "MIN_RING",
    "ChannelInfo",
    "Record",
    "Row",
    "Segment",
    "SegmentStats",
    "SlotState",
    "peek",
    "segment_path",
]
