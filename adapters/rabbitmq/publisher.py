"""A thread's publishing connection: a batch in one write, its publisher confirms in one round trip.

The channel is in confirm mode: the broker numbers every message the channel publishes (1, 2, ...) and
acknowledges them, usually many at once (``multiple``). A batch is therefore sent as one ``sendall`` of
precomputed frames (:func:`.amqp.publish_frames`) and done when the ack of its last number arrived. Messages are
published ``mandatory``: a stream that no longer exists returns them (``basic.return`` before their ack) instead
of dropping them silently.
"""

from __future__ import annotations

import time

from ..bridge.outcome import ReplyLost
from . import amqp
from .connection import AmqpConnection, Closed

__all__ = ["StreamPublisher"]

_PUB, _FIND = 1, 2


class StreamPublisher:
    """Channel 1 of ``conn`` in confirm mode, publishing to ``stream`` through the default exchange."""

    def __init__(self, conn: AmqpConnection, stream: str, timeout: float) -> None:
        self.conn = conn
        self.stream = stream
        self.timeout = timeout
        self.seq = 0  #: the number of the last message published on the channel
        self.acked = 0  #: every number up to this one is acknowledged
        self.nacked = False
        self.returned = 0
        self.seen = 0  #: an id at or below which none of this publisher's next messages can be (see :meth:`find`)
        self.prefix = amqp.publish_prefix(_PUB, stream)
        conn.on_confirm = self._confirmed
        conn.on_return = self._returned
        conn.open_channel(_PUB, timeout, confirms=True)

    def _confirmed(self, tag: int, multiple: int, nack: bool) -> None:
        if nack:
            self.nacked = True
        if tag > self.acked:
            self.acked = tag

    def _returned(self, channel: int, code: int, text: str) -> None:
        if channel == _PUB:
            self.returned += 1

    def closed_while_idle(self) -> bool:
        """The broker closed the connection while it was idle (a restart, ``close_connection``): read it now, so the
        publish goes on a new connection instead of failing."""
        conn = self.conn
        if conn.closed:
            return True
        try:
            while conn.readable():
                conn.pump(0)
        except (OSError, Closed, ValueError):
            return True
        return conn.closed

    def send(self, bodies: list[bytes]) -> int:
        """Publish ``bodies`` and wait for their confirms (``timeout``); how many the broker returned. Raises
        :class:`ReplyLost` once anything was written, the connection's errors before."""
        conn = self.conn
        data = amqp.publish_frames(self.prefix, _PUB, bodies, conn.frame_max)
        last = self.seq + len(bodies)
        self.returned, self.nacked = 0, False
        try:
            conn.sock.sendall(data)
        except OSError as exc:
            raise ReplyLost(exc, sent=None) from exc
        self.seq = last
        deadline = time.monotonic() + self.timeout
        try:
            while self.acked < last:
                conn.pump(deadline - time.monotonic(), wait=True)
        except (OSError, Closed, ValueError) as exc:
            raise ReplyLost(exc, sent=True) from exc
        if self.nacked:
            raise ReplyLost(Closed(_PUB, 0, "the broker nacked a message (it may not be stored)"), sent=True)
        return self.returned

    def tail(self, timeout: float) -> int:
        """The newest id the stream holds now, as far as its last chunk arrives within ``timeout`` (0: empty, or
        not seen in time): a lower bound for the ids of what this publisher sends next."""
        conn = self.conn
        conn.open_channel(_FIND, timeout)
        newest = 0
        try:
            conn.consume(_FIND, self.stream, "shmbus-tail", "last", 1000, timeout)
            deadline = time.monotonic() + timeout
            while not any(d.channel == _FIND for d in conn.deliveries) and time.monotonic() < deadline:
                conn.pump(deadline - time.monotonic())
            while conn.pump(0):
                pass
            newest = max([d.offset + 1 for d in conn.deliveries if d.channel == _FIND and d.offset is not None] or [0])
        finally:
            conn.deliveries = [d for d in conn.deliveries if d.channel != _FIND]
            if not conn.closed:
                conn.close_channel(_FIND, timeout)
        return newest

    def find(self, bodies: list[bytes], after: int, timeout: float) -> list[int] | None:
        """The ids of ``bodies`` (published, confirmed) read from the stream after id ``after`` (or :attr:`seen`,
        the newest this publisher found before), matched in order; None when they did not all appear within
        ``timeout``."""
        after = max(after, self.seen)
        conn = self.conn
        conn.open_channel(_FIND, timeout)
        found: list[int] = []
        try:
            conn.consume(_FIND, self.stream, "shmbus-find", after, 2000, timeout)
            deadline = time.monotonic() + timeout
            while len(found) < len(bodies):
                mine = [d for d in conn.deliveries if d.channel == _FIND]
                conn.deliveries = [d for d in conn.deliveries if d.channel != _FIND]
                for d in mine:
                    if d.offset is not None and d.offset >= after and len(found) < len(bodies) \
                            and d.body == bodies[len(found)]:  # fmt: skip
                        found.append(d.offset + 1)
                if mine:
                    conn.ack(_FIND, mine[-1].tag)
                if len(found) == len(bodies):
                    self.seen = max(self.seen, found[-1])
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                try:
                    conn.pump(left)
                except TimeoutError:
                    return None
        finally:
            conn.deliveries = [d for d in conn.deliveries if d.channel != _FIND]
            if not conn.closed:
                conn.close_channel(_FIND, timeout)
        return found
