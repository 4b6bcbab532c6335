"""The Redis relay's doorbell: one SUBSCRIBE connection to the gem's channel and the seal channel.

A line's id is a hint; the relay reads the backlog unless the line came sealed (the bridge kit's ``seals``). The
wake-up path is the bridge's cross-host latency, so it reads the socket itself: one ``poll`` and one ``recv`` per
wake-up, every reply of that read parsed by hiredis at once (redis-py's ``read_response`` costs several times that
per reply, and its ``can_read`` polls again after each). Without hiredis, or on TLS (decrypted bytes may wait above
the socket), redis-py reads.
"""

from __future__ import annotations

import select
import ssl
import time
from typing import Any

import redis

from ..bridge.backend import DoorbellRing
from ..bridge.seals import NO_RING, seal_of
from ..bridge.wire import parse_id

_hiredis: Any
try:
    import hiredis as _hiredis
except ImportError:  # an optional speed-up (shmbus[redis] installs it)
    _hiredis = None

__all__ = ["RedisDoorbell"]

_READ = 1 << 16
_REPLIES_PER_RING = 4096  # redis-py's path: replies one ring takes (a ring's work is bounded, as hiredis's one read)


def _nothing_buffered(conn: Any) -> bool:
    """Has redis-py's parser no bytes of a reply left (a hiredis reader that says so)? Only then may the doorbell
    read the socket itself without cutting a reply in two."""
    reader = getattr(getattr(conn, "_parser", None), "_reader", None)
    return reader is not None and hasattr(reader, "has_data") and not reader.has_data()


class RedisDoorbell:
    """The SUBSCRIBE connection (see the module doc), made like ``client``'s (the bridge's: RESP2, whose pub/sub replies
    are plain arrays)."""

    def __init__(self, client: redis.Redis, pubsub_channel: str, seal_channel: str, socket_timeout: float) -> None:
        pool = client.connection_pool
        self.socket_timeout = socket_timeout
        self.conn: Any = pool.connection_class(**pool.connection_kwargs)
        self.conn.connect()
        self.ping_sent = 0.0
        self.channel = pubsub_channel.encode()
        self.seals = seal_channel.encode()
        self.conn.send_command("SUBSCRIBE", pubsub_channel, seal_channel)
        for _ in range(2):
            reply = self.conn.read_response()
            if not reply or reply[0] != b"subscribe":
                raise redis.exceptions.ConnectionError(f"unexpected SUBSCRIBE reply {reply!r}")
        sock = getattr(self.conn, "_sock", None)
        self._sock: Any = None  # the socket the doorbell reads itself (None: redis-py reads)
        self._reader: Any = None
        self._poller: select.poll | None = None
        self._early: list[Any] = []  # replies redis-py had read before the doorbell took the socket over
        self._more = False  # redis-py's path: the last ring left replies to read (it took its bound)
        if sock is not None and not isinstance(sock, ssl.SSLSocket) and hasattr(select, "poll"):
            self._poller = select.poll()
            self._poller.register(sock, select.POLLIN)
            if _hiredis is not None:
                while len(self._early) < _REPLIES_PER_RING and self.conn.can_read(timeout=0):
                    self._early.append(self.conn.read_response())
                self._more = len(self._early) >= _REPLIES_PER_RING  # if redis-py keeps reading, the rest first
                if _nothing_buffered(self.conn):  # else a reply's start is in redis-py's buffer: it keeps reading
                    self._sock = sock
                    self._reader = _hiredis.Reader()

    def ring(self, timeout: float) -> DoorbellRing:
        """Wait up to ``timeout`` s; what the notices of one read brought."""
        if self._sock is None:
            return self._ring_via_redis_py(timeout)
        replies, self._early = self._early, []
        if not replies:
            if not self._poller or not self._poller.poll(timeout * 1000):
                return self._quiet()
            reader = self._reader
            data = self._sock.recv(_READ)
            if not data:
                raise redis.exceptions.ConnectionError("the subscription connection was closed by Redis")
            reader.feed(data)
            try:
                reply = reader.gets()
                while reply is not False:
                    replies.append(reply)
                    reply = reader.gets()
            except _hiredis.ProtocolError as exc:
                why = f"unreadable reply on the subscription connection: {exc}"
                raise redis.exceptions.ConnectionError(why) from exc
        return self._collect(replies)

    def _collect(self, replies: list[Any]) -> DoorbellRing:
        top = 0
        lines: list[bytes] = []
        seals: dict[int, tuple[int, bytes]] = {}
        for reply in replies:
            if not isinstance(reply, list) or not reply:
                continue
            kind = reply[0]
            if kind == b"message":
                if reply[1] == self.seals:
                    seal = seal_of(reply[2])
                    if seal is not None:
                        seals[seal[0]] = seal[1:]
                else:
                    line = reply[2]
                    lines.append(line)
                    bar = line.find(b"|", 0, 20)  # an id has at most 19 digits: look no further
                    gid = parse_id(line[:bar]) if bar > 0 else None
                    if gid is not None and gid > top:
                        top = gid
            elif kind == b"pong":
                self.ping_sent = 0.0
        return DoorbellRing(top, lines, seals) if lines or seals else NO_RING

    def _quiet(self) -> DoorbellRing:
        if self.ping_sent and time.monotonic() - self.ping_sent > self.socket_timeout:
            raise redis.exceptions.TimeoutError("no PING reply on the subscription connection")
        return NO_RING

    def _ring_via_redis_py(self, timeout: float) -> DoorbellRing:
        conn = self.conn
        if self._more:  # the last ring stopped at its bound: the rest may wait in redis-py's buffer, unseen by poll
            readable = conn.can_read(timeout=0)
        elif self._poller is not None:
            readable = bool(self._poller.poll(timeout * 1000))
        else:
            readable = conn.can_read(timeout=timeout)
        if not readable:
            self._more = False
            return self._quiet()
        replies = []
        while True:
            replies.append(conn.read_response())  # a closed connection raises here (the read finds EOF)
            self._more = conn.can_read(timeout=0)
            if not self._more or len(replies) >= _REPLIES_PER_RING:  # a flood of notices ends no ring
                return self._collect(replies)

    def keepalive(self) -> None:
        if not self.ping_sent:
            self.conn.send_command("PING")  # a silently dead connection (no RST) shows as a missing PONG
            self.ping_sent = time.monotonic()

    def close(self) -> None:
        self.conn.disconnect()
