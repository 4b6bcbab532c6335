"""The waiting clients of one middleware in one process or loop, and the delivery of live batches to them."""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from typing import Any

from shmbus.bus import Bus
from shmbus.message import Message

from .visibility import PRIVATE, Piece, Visibility
from .waiter import COUNTED, INDEXED, Ending, Move, Stage, Waiter, filter_allows
from .wire import EMPTY_CHUNK, MAX_STREAM_BUFFER, encode_message, frame_chunk


class _Group:
    """Messages of one (site, channel) in one batch, encoded lazily and once for every recipient."""

    __slots__ = ("enc", "frame", "inner", "is_json", "msgs", "plain", "vis")

    def __init__(self, msgs: list[Message], is_json: bool) -> None:
        self.msgs = msgs
        self.is_json = is_json
        self.plain = not any(m.targeted for m in msgs)
        self.enc: list[bytes] | None = None
        self.inner: bytes | None = None
        self.frame: bytes | None = None
        self.vis: Visibility | None = None

    def encoded(self) -> list[bytes]:
        if self.enc is None:
            self.enc = [encode_message(m, self.is_json) for m in self.msgs]
        return self.enc

    def shared_inner(self) -> bytes:
        if self.inner is None:
            self.inner = b",".join(self.encoded())
        return self.inner

    def shared_frame(self) -> bytes:
        if self.frame is None:
            self.frame = frame_chunk(b"[" + self.shared_inner() + b"]")
        return self.frame

    def piece_for(self, c: Waiter, ok: list[bool] | None) -> Piece | None:
        """What ``c`` may see of every message here, computed once per visibility class (see
        :mod:`.visibility`) and shared by every client of the class; None when ``c`` needs its own."""
        vis = self.vis
        if vis is None:
            vis = self.vis = Visibility(self.msgs)
        key = vis.key(c.client_id, c.user_id, c.group_ids)
        if key is PRIVATE:
            return None
        piece = vis.pieces.get(key)
        if piece is None:
            enc = self.encoded()
            parts = []
            for i, m in enumerate(self.msgs):
                if (ok is None or ok[i]) and c.allowed(m):
                    parts.append(enc[i])
            piece = vis.pieces[key] = Piece(b",".join(parts), len(parts), len(parts) < len(enc))
        return piece


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
            self._deliver(c, key[1], _Group(msgs, self.is_json), self._filter_ok(msgs))

    def finish(self, c: Waiter) -> tuple[list[bytes], bytes | None]:
        """Unregister ``c`` (by identity) and take what it still has to send: ``(pending, status_entry)``."""
        with self.lock:
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

    def dispatch(self, msgs: list[Message]) -> list[Waiter]:
        """Hand a batch from the bus listener to the waiting clients; return the clients to wake.

        Each (site, channel) group is encoded once for every recipient; a client gets one piece per channel
        per batch (a shared bytes object unless targeting/filters/its last id require a subset).
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
            for key, gm in groups.items():
                clients = index.get(key)
                if not clients:
                    continue
                group = _Group(gm, is_json)
                ok = self._filter_ok(gm)
                channel = key[1]
                for c in tuple(clients):
                    if c.stage is capturing:
                        c.held.extend(gm)  # type: ignore[union-attr]  # a capturing waiter holds a list
                        continue
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

    def _deliver(self, c: Waiter, channel: str, group: _Group, ok: list[bool] | None) -> None:
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
