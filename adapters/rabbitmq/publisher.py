"""A thread's publishing connection: a batch in one write; its confirms and its ids in one round trip.

The channel is in confirm mode: the broker numbers every message the channel publishes (1, 2, ...) and
acknowledges them, usually many at once (``multiple``). A batch is therefore sent as one ``sendall`` of
precomputed frames (:func:`.amqp.publish_frames`) and done when the ack of its last number arrived. Messages are
published ``mandatory``: a stream that no longer exists returns them (``basic.return`` before their ack) instead
of dropping them silently.

A confirm carries no offset, so the same connection also consumes the stream from its end (``"next"``, attached
before the first publish): the broker delivers our messages back about when it confirms them, each with its
``x-stream-offset`` (its id). Each message carries ``correlation-id`` = this publisher's random token and its
number, and is recognised by that mark *and* its body: the id always comes from the broker's offset, so a forged
mark can at worst name a message with the very same content. Relays ignore the property.
"""

from __future__ import annotations

import secrets
import time

from ..bridge.outcome import ReplyLost
from . import amqp
from .connection import AmqpConnection, Closed

__all__ = ["StreamPublisher"]

_PUB, _OWN = 1, 4  # the confirmed channel; the consumer of our own messages (3: the stream's declaration)
_PREFETCH = 2000


class StreamPublisher:
    """Channel 1 of ``conn`` in confirm mode, publishing to ``stream`` through the default exchange; channel 4
    following the stream's end for our messages' offsets."""

    def __init__(self, conn: AmqpConnection, stream: str, timeout: float) -> None:
        self.conn = conn
        self.stream = stream
        self.timeout = timeout
        self.seq = 0  #: the number of the last message published on the channel
        self.acked = 0  #: every number up to this one is acknowledged
        self.nacked = False
        self.returned = 0
        self.token = secrets.token_hex(8).encode() + b"."  #: our messages' mark: token, then their number
        self.ids: list[int] | None = None  #: the last batch's ids (None: not all seen in time)
        self.before: dict[int, bytes] = {}  #: our id -> the body of the entry just before it in the stream
        self._wanted: dict[int, bytes] = {}  # number -> body, of the batch in flight
        self._found: dict[int, int] = {}  # number -> id
        self._last: tuple[int, bytes] | None = None  # the newest entry delivered: (id, body)
        self._tag = 0
        self.prefix = amqp.publish_prefix(_PUB, stream)
        conn.on_confirm = self._confirmed
        conn.on_return = self._returned
        conn.open_channel(_PUB, timeout, confirms=True)
        conn.open_channel(_OWN, timeout)
        self.follow()

    def follow(self) -> None:
        """(Re)start the consumer of our messages at the stream's end (a new stream, or one far ahead)."""
        conn = self.conn
        if self._tag and _OWN not in conn.cancelled:
            conn.cancel(_OWN, f"shmbus-own-{self._tag}", self.timeout)
        conn.cancelled.discard(_OWN)
        conn.deliveries = [d for d in conn.deliveries if d.channel != _OWN]
        self._last = None
        self._tag += 1
        conn.consume(_OWN, self.stream, f"shmbus-own-{self._tag}", "next", _PREFETCH, self.timeout)

    def _confirmed(self, tag: int, multiple: int, nack: bool) -> None:
        if nack:
            self.nacked = True
        if tag > self.acked:
            self.acked = tag

    def _returned(self, channel: int, code: int, text: str) -> None:
        if channel == _PUB:
            self.returned += 1

    def _take(self) -> int:
        """Read the deliveries: the ids of our messages in flight; how many entries were delivered."""
        conn = self.conn
        if not conn.deliveries:
            return 0
        mine = [d for d in conn.deliveries if d.channel == _OWN]
        conn.deliveries = []  # (another channel's: the declaration's check consumer, never read)
        token, wanted, found, last = self.token, self._wanted, self._found, self._last
        for d in mine:
            if d.offset is None or (last is not None and d.offset + 1 <= last[0]):
                continue
            gid = d.offset + 1
            mark = amqp.correlation_id(d.header) if wanted else None
            if mark is not None and mark.startswith(token):
                rest = mark[len(token) :]
                num = int(rest) if rest.isdigit() else 0
                if wanted.get(num) == d.body and num not in found:
                    found[num] = gid
                    if last is not None and last[0] == gid - 1:
                        self.before[gid] = last[1]
            last = (gid, d.body)
        self._last = last
        if mine:
            conn.ack(_OWN, mine[-1].tag)
        return len(mine)

    def closed_while_idle(self) -> bool:
        """The broker closed the connection while it was idle (a restart, ``close_connection``): read it now, so the
        publish goes on a new connection instead of failing. Reads what was delivered meanwhile: a consumer that
        ran out of credit is behind the stream's end, and starts again there."""
        conn = self.conn
        if conn.closed:
            return True
        taken = 0
        try:
            while conn.readable():
                conn.pump(0)
                taken += self._take()
            if taken >= _PREFETCH or _OWN in conn.cancelled:
                self.follow()
        except (OSError, Closed, ValueError):
            return True
        return conn.closed

    def send(self, bodies: list[bytes]) -> int:
        """Publish ``bodies`` and wait for their confirms and their deliveries (``timeout``, together): their ids
        in :attr:`ids`; how many the broker returned. Raises :class:`ReplyLost` once anything was written, the
        connection's errors before."""
        conn = self.conn
        first, n = self.seq + 1, len(bodies)
        marks = [self.token + str(first + i).encode() for i in range(n)]
        data = amqp.publish_frames(self.prefix, _PUB, bodies, conn.frame_max, marks)
        last = self.seq + n
        self.returned, self.nacked, self.ids = 0, False, None
        self._wanted = {first + i: body for i, body in enumerate(bodies)}
        self._found = {}
        self.before = {}
        try:
            conn.sock.sendall(data)
        except OSError as exc:
            raise ReplyLost(exc, sent=None) from exc
        self.seq = last
        deadline = time.monotonic() + self.timeout
        try:
            while True:
                self._take()
                if self.acked >= last and (
                    self.returned or self.nacked or len(self._found) == n or _OWN in conn.cancelled
                ):
                    break
                conn.pump(deadline - time.monotonic(), wait=True)
        except TimeoutError as exc:
            if self.acked < last:
                raise ReplyLost(exc, sent=True) from exc
        except (OSError, Closed, ValueError) as exc:
            raise ReplyLost(exc, sent=True) from exc
        finally:
            self._wanted = {}
        if self.nacked:
            raise ReplyLost(Closed(_PUB, 0, "the broker nacked a message (it may not be stored)"), sent=True)
        if len(self._found) == n:
            self.ids = [self._found[first + i] for i in range(n)]
        return self.returned
