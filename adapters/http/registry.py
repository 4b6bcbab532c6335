"""The waiting clients of one middleware in one process or loop, and the delivery of live batches to them."""

from __future__ import annotations

import threading
from collections import deque
from contextlib import AbstractContextManager
from typing import Any

from shmbus.bus import Bus
from shmbus.message import Message

from .group import DEFER_OVER, Deferred, Group
from .waiter import COUNTED, INDEXED, Ending, Move, Stage, Waiter, filter_allows
from .wire import EMPTY_CHUNK, MAX_STREAM_BUFFER, frame_chunk


# ---------------------------------------------------------------------------------------------------- registry
class Registry:
    """Waiting clients of one middleware in one process (or event loop), indexed by (site, channel) and id.

    ``lock`` guards the index; shells that run everything on one thread (asyncio, gevent) pass a no-op lock.
    """

    def __init__(
        self, bus: Bus, lock: AbstractContextManager[Any] | None = None, max_stream_buffer: int = MAX_STREAM_BUFFER
    ) -> None:
        self.bus = bus
        self.lock: AbstractContextManager[Any] = lock if lock is not None else threading.Lock()
        self.index: dict[tuple[str | None, str], set[Waiter]] = {}
        self.by_id: dict[str, Waiter] = {}
        self.parked = 0  # waiting requests, streams included (``max_active_clients`` counts both)
        self.streams = 0
        self.max_stream_buffer = max_stream_buffer
        self.is_json = bus.codec.is_json
        self.metrics = bus.metrics
        #: deferred deliveries not yet served to every client, oldest first (see :meth:`dispatch`)
        self.owed: deque[Deferred] = deque()
        bus.metrics.add_source(self)

    def metrics_gauges(self) -> dict[str, int]:
        """This registry's part of the bus's gauges (:mod:`shmbus.metrics`)."""
        return {"parked": self.parked - self.streams, "streams": self.streams}

    # -- registration
    def capture(self, c: Waiter) -> None:
        """Start collecting live messages for ``c`` (before its backlog is read: closes the park race)."""
        with self.lock:
            c.move(Move.CAPTURE)
            index = self.index
            for key in c.keys:
                s = index.get(key)
                if s is None:
                    index[key] = {c}
                else:
                    s.add(c)

    def _unindex(self, c: Waiter, move: Move) -> None:
        """Take ``move`` (one that leaves the index) and drop ``c`` from the index if it was there."""
        before = c.stage
        c.move(move)
        if before not in INDEXED:
            return
        index = self.index
        for key in c.keys:
            s = index.get(key)
            if s is not None:
                s.discard(c)
                if not s:
                    del index[key]
        if before in COUNTED:
            self.parked -= 1
            if c.streaming:
                self.streams -= 1
        if self.by_id.get(c.client_id) is c:
            del self.by_id[c.client_id]

    def discard(self, c: Waiter) -> None:
        """Drop ``c`` before it was parked: it is answered at once (or its backlog read failed)."""
        with self.lock:
            self._unindex(c, Move.LEAVE)
            c.held = None

    def end(self, c: Waiter, ending: Ending) -> None:
        """End ``c`` for ``ending`` from the shell's side (the client went away), under the lock."""
        with self.lock:
            c.end(ending)

    def park(self, c: Waiter) -> tuple[bool, list[Waiter]]:
        """Make ``c`` the parked request of its client id; deliver what arrived since capture.

        Returns ``(accepted, wake)``: ``accepted`` is False when a parked request with a higher ``__seq``
        exists (``c`` is then unregistered and should be answered with what it has); ``wake`` lists clients
        to wake (a superseded older request, and ``c`` itself if messages arrived meanwhile).
        """
        wake: list[Waiter] = []
        with self.lock:
            old = self.by_id.get(c.client_id)
            if old is not None and old.seq > c.seq:
                self._unindex(c, Move.LEAVE)
                c.held = None
                return False, wake
            c.move(Move.PARK)  # first: an illegal park raises before anything changed
            if old is not None:
                self._unindex(old, Move.FINISH)  # superseded: it ends with what it has
                wake.append(old)
            self.by_id[c.client_id] = c
            held, c.held = c.held, None
            self.parked += 1
            if c.streaming:
                self.streams += 1
            if held:
                self._deliver_held(c, held)
                if c.pending or c.done:
                    wake.append(c)
        return True, wake

    def _deliver_held(self, c: Waiter, held: list[Message]) -> None:
        groups: dict[tuple[str | None, str], list[Message]] = {}
        for m in held:
            groups.setdefault((m.site_id, m.channel), []).append(m)
        for key, msgs in groups.items():
            self._deliver(c, key[1], Group(msgs, self.is_json), self._filter_ok(msgs))

    def finish(self, c: Waiter) -> tuple[list[bytes], bytes | None]:
        """Unregister ``c`` (by identity) and take what it still has to send: ``(pending, status_entry)``
        (a deferred delivery's piece it is still owed included)."""
        with self.lock:
            if self.owed and c.stage in COUNTED:
                self._settle(c)
            self._unindex(c, Move.FINISH)
            pending, c.pending = c.pending, []
            c.bytes_pending = 0
            return pending, c.status_entry()

    def take(self, c: Waiter) -> list[bytes]:
        """Streaming: take the queued chunks."""
        with self.lock:
            pending, c.pending = c.pending, []
            c.bytes_pending = 0
            return pending

    # -- delivery
    def _filter_ok(self, msgs: list[Message]) -> list[bool] | None:
        bus = self.bus
        if not bus.client_message_filters:
            return None
        return [filter_allows(bus, m) for m in msgs]

    def dispatch(self, msgs: list[Message], deferred: list[Deferred] | None = None) -> list[Waiter]:
        """Hand a batch from the bus listener to the waiting clients; return the clients to wake.

        Each (site, channel) group is encoded once for every recipient; a client gets one piece per channel
        per batch (a shared bytes object unless targeting/filters/its last id require a subset).

        ``deferred``: a group for more than :data:`DEFER_OVER` clients is not delivered now but appended there
        as a :class:`Deferred`, which the caller serves a slice at a time (:meth:`serve`); meanwhile a client it
        still owes gets its piece first whenever anything else is delivered to it or it ends (:meth:`_settle`),
        so each client's pieces stay in publish order.
        """
        index = self.index
        groups: dict[tuple[str | None, str], list[Message]] = {}
        with self.lock:
            if not index:
                return []
            for m in msgs:
                key = (m.site_id, m.channel)
                if key in index:
                    g = groups.get(key)
                    if g is None:
                        groups[key] = [m]
                    else:
                        g.append(m)
            if not groups:
                return []
            wake: list[Waiter] = []
            woken: set[Waiter] = set()
            is_json = self.is_json
            capturing, ending = Stage.CAPTURING, Stage.ENDING
            owed = self.owed
            for key, gm in groups.items():
                clients = index.get(key)
                if not clients:
                    continue
                group = Group(gm, is_json)
                ok = self._filter_ok(gm)
                channel = key[1]
                if deferred is not None and len(clients) > DEFER_OVER:
                    d = Deferred(tuple(clients), channel, group, ok)
                    owed.append(d)
                    deferred.append(d)
                    continue
                for c in tuple(clients):
                    if c.stage is capturing:
                        c.held.extend(gm)  # type: ignore[union-attr]  # a capturing waiter holds a list
                        continue
                    if owed:
                        self._settle(c)
                    before = len(c.pending)
                    self._deliver(c, channel, group, ok)
                    if c.stage is ending:
                        self._unindex(c, Move.RELEASE)
                        if c not in woken:
                            woken.add(c)
                            wake.append(c)
                    elif len(c.pending) != before and c not in woken:
                        woken.add(c)
                        wake.append(c)
            return wake

    # -- deferred deliveries (a broadcast served in slices)
    def serve(self, d: Deferred, step: int) -> list[Waiter]:
        """Deliver ``d`` to its next ``step`` clients (those still waiting; a client it no longer owes is
        skipped); return those to wake. ``d`` leaves :attr:`owed` once served to its last client."""
        wake: list[Waiter] = []
        with self.lock:
            clients = d.clients
            pos = d.pos
            end = min(pos + step, len(clients))
            d.pos = end
            channel, group, ok = d.channel, d.group, d.ok
            taken = d.taken
            # the common case inline (a stream, a batch of untargeted messages all new to it): _deliver's first
            # branch, without its calls
            msgs = group.msgs
            fast = ok is None and group.plain
            frame = group.shared_frame() if fast else b""
            size, count, epoch = len(frame), len(msgs), msgs[0].epoch
            first, top = msgs[0].message_id, msgs[-1].message_id
            limit = self.max_stream_buffer
            delivered = 0
            parked = Stage.PARKED
            for i in range(pos, end):
                c = clients[i]
                stage = c.stage
                if stage not in INDEXED or (taken is not None and c in taken):
                    continue
                if stage is Stage.CAPTURING:
                    c.held.extend(msgs)  # type: ignore[union-attr]  # a capturing waiter holds a list
                    continue
                if fast and c.streaming and c.epoch == epoch and c.bytes_pending + size <= limit:
                    last = c.last
                    if first > last.get(channel, 0):
                        last[channel] = top
                        delivered += count
                        write_now = c.write_now
                        if write_now is not None and stage is parked and not c.pending and write_now(frame):
                            continue
                        c.pending.append(frame)
                        c.bytes_pending += size
                        wake.append(c)
                        continue
                before = len(c.pending)
                self._deliver(c, channel, group, ok)
                if c.stage is Stage.ENDING:
                    self._unindex(c, Move.RELEASE)
                    wake.append(c)
                elif len(c.pending) != before:
                    wake.append(c)
            self.metrics.deliveries += delivered
            if end >= len(clients):
                self.owed.remove(d)
        return wake

    def _settle(self, c: Waiter) -> None:
        """Give ``c`` now the pieces of the deferred deliveries that still owe it one (oldest first), before
        anything newer reaches it (under the lock)."""
        for d in self.owed:
            at = d.at
            if at is None:
                at = d.at = dict(zip(d.clients, range(len(d.clients)), strict=True))
            i = at.get(c)
            if i is None or i < d.pos:
                continue
            taken = d.taken
            if taken is None:
                taken = d.taken = set()
            elif c in taken:
                continue
            taken.add(c)
            if c.stage in COUNTED:
                self._deliver(c, d.channel, d.group, d.ok)

    def _deliver(self, c: Waiter, channel: str, group: Group, ok: list[bool] | None) -> None:
        msgs = group.msgs
        if msgs[0].epoch != c.epoch:
            c.end(Ending.RESET)
            if c.streaming:
                st = c.status_entry()
                self._push(c, frame_chunk(b"[" + st + b"]") if st else EMPTY_CHUNK)
            return
        last = c.last.get(channel, 0)
        top = msgs[-1].message_id
        if top <= last:
            return  # all already delivered (or skipped) by the backlog read
        if ok is None and group.plain and msgs[0].message_id > last:
            c.last[channel] = top
            self._push(c, group.shared_frame() if c.streaming else group.shared_inner())
            self.metrics.deliveries += len(msgs)
            return
        if msgs[0].message_id > last:  # all new to c: what it sees depends only on its visibility class
            piece = group.piece_for(c, ok)
            if piece is not None:
                c.last[channel] = top
                if piece.withheld:
                    if c.status_due is None:
                        c.status_due = set()
                    c.status_due.add(channel)
                if piece.count:
                    self.metrics.deliveries += piece.count
                    self._push(c, piece.frame() if c.streaming else piece.inner)
                return
        enc = group.encoded()
        parts = []
        withheld = False
        for i, m in enumerate(msgs):
            if m.message_id <= last:
                continue
            if (ok is not None and not ok[i]) or not c.allowed(m):
                withheld = True
                continue
            parts.append(enc[i])
        c.last[channel] = max(top, last)
        if withheld:
            if c.status_due is None:
                c.status_due = set()
            c.status_due.add(channel)
        if parts:
            self.metrics.deliveries += len(parts)
            inner = b",".join(parts)
            self._push(c, frame_chunk(b"[" + inner + b"]") if c.streaming else inner)

    def _push(self, c: Waiter, piece: bytes) -> None:
        c.pending.append(piece)
        if c.streaming:
            c.bytes_pending += len(piece)
            if c.bytes_pending > self.max_stream_buffer:
                c.end(Ending.DROPPED)
                c.pending = []
                c.bytes_pending = 0
        elif c.stage is Stage.PARKED:
            c.end()  # a long poll ends with its first delivery
