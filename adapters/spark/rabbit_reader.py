"""The Spark source's reader of a RabbitMQ bridge's stream (``rabbitmq_url``): executors on any host read the bus
the RabbitMQ bridge keeps, with the stream's ids (offset + 1).

A stream has no per-channel index: :class:`RabbitReader` scans it. ``last_ids`` (the driver, once per micro-batch)
reads on from where its previous scan stopped up to the stream's newest entry, noting each channel's newest and
oldest id; ``read`` (an executor) consumes from the range's first offset to its last and keeps the channel's
messages. No pyspark import; plain data in, plain data out (:class:`~.readers.Chunk`).
"""

from __future__ import annotations

import time
from typing import Any

from shmbus import jsonlib
from shmbus.channels import backend_name
from shmbus.message import encode_meta

from ..rabbitmq.connection import AmqpConnection, Delivery
from ..rabbitmq.errors import parse_url
from ..rabbitmq.reader import parse_body
from .chunk import Chunk, Location

__all__ = ["RabbitReader"]

_WAIT = 10.0  # seconds any one read of the broker may take
_TAIL_WAIT = 1.0  # how long an empty stream is given to show its last chunk


class RabbitReader:
    """Reads the stream ``location.rabbitmq_stream`` of the broker at ``location.rabbitmq_url`` (see the module doc).
    Like Redis and PostgreSQL it has no bus epoch (0): a deleted stream shows as ids going backwards."""

    def __init__(self, location: Location) -> None:
        assert location.rabbitmq_url
        self.location = location
        self.stream = location.rabbitmq_stream or "message_bus"
        a = parse_url(location.rabbitmq_url)
        self.conn = AmqpConnection(a.host, a.port, a.user, a.password, a.vhost, _WAIT)
        self.is_json = True
        self._scanned = 0  # ids up to this one were scanned by last_ids
        self._newest: dict[str, int] = {}
        self._oldest: dict[str, int] = {}
        self._channel = 0

    def _chan(self, channel: str) -> str:
        return backend_name(channel, self.location.site_id)

    def epoch(self) -> int:
        return 0

    def _entries(self, offset: object, upto: int | None) -> list[Delivery]:
        """The stream's entries from ``offset`` up to id ``upto`` (None: up to its newest entry now)."""
        if upto is None:
            upto = self._tail()
        if upto == 0 or (isinstance(offset, int) and upto <= offset):
            return []  # nothing at or after ``offset`` up to ``upto``: no delivery would ever come
        conn = self.conn
        self._channel += 1
        channel = self._channel
        conn.open_channel(channel, _WAIT)
        out: list[Delivery] = []
        try:
            conn.consume(channel, self.stream, "spark", offset, 2000, _WAIT)
            deadline = time.monotonic() + _WAIT
            while not out or (out[-1].offset or 0) + 1 < upto:
                got = [d for d in conn.deliveries if d.channel == channel]
                conn.deliveries = [d for d in conn.deliveries if d.channel != channel]
                if got:
                    conn.ack(channel, got[-1].tag)
                    out += [d for d in got if d.offset is not None and d.offset + 1 <= upto]
                    deadline = time.monotonic() + _WAIT
                    if (got[-1].offset or 0) + 1 >= upto:
                        break
                    continue
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the stream {self.stream!r} stopped delivering before id {upto}")
                conn.pump(deadline - time.monotonic())
        finally:
            conn.deliveries = [d for d in conn.deliveries if d.channel != channel]
            conn.close_channel(channel, _WAIT)
        return out

    def _tail(self) -> int:
        """The stream's newest id now (0: empty), on a channel of its own."""
        conn = self.conn
        self._channel += 1
        channel = self._channel
        conn.open_channel(channel, _WAIT)
        try:
            conn.consume(channel, self.stream, "spark-tail", "last", 2000, _WAIT)
            deadline = time.monotonic() + _TAIL_WAIT
            while not any(d.channel == channel for d in conn.deliveries) and time.monotonic() < deadline:
                conn.pump(deadline - time.monotonic())
            while conn.pump(0.05):
                pass
            got = [d.offset + 1 for d in conn.deliveries if d.channel == channel and d.offset is not None]
            return max(got or [0])
        finally:
            conn.deliveries = [d for d in conn.deliveries if d.channel != channel]
            conn.close_channel(channel, _WAIT)

    def last_ids(self, channels: list[str]) -> dict[str, int]:
        if channels:
            entries = self._entries(self._scanned, None)
            for d in entries:
                gid = (d.offset or 0) + 1
                row = parse_body(gid, d.body)
                if row is not None:
                    self._newest[row.channel] = gid
                    self._oldest.setdefault(row.channel, gid)
                self._scanned = max(self._scanned, gid)
        return {ch: self._newest.get(self._chan(ch), 0) for ch in channels}

    def first_available(self, channel: str) -> int:
        last = self.last_ids([channel])[channel]
        return self._oldest.get(self._chan(channel), last + 1)

    def read(self, channel: str, after: int, upto: int) -> Chunk:
        chan = self._chan(channel)
        out = Chunk(is_json=True, sparse=True)
        entries = self._entries(after, upto) if upto > after else []
        oldest = (entries[0].offset or 0) + 1 if entries else None
        for d in entries:
            gid = (d.offset or 0) + 1
            row = parse_body(gid, d.body)
            if row is None or row.channel != chan or gid <= after:
                continue
            envelope = jsonlib.loads(row.value or b"")
            out.message_ids.append(gid)
            out.global_ids.append(gid)
            out.timestamps.append(None)
            out.payloads.append(jsonlib.dumps_lenient(envelope.get("data")))
            c, u, g = envelope.get("client_ids"), envelope.get("user_ids"), envelope.get("group_ids")
            out.metas.append(encode_meta(c, u, g) if (c or u or g) else b"")
        out.last_id = max(upto, self._newest.get(chan, 0))
        out.first_available = after + 1
        if oldest is not None and oldest > after + 1 and self._first() > after + 1:
            # retention deleted entries after ``after`` (the broker's own entries also skip offsets: only the
            # stream's oldest entry says): no channel index says whether any was this channel's, so the loss is
            # reported from the oldest entry held
            out.first_available = oldest
        return out

    def _first(self) -> int:
        """The id of the stream's oldest entry (0: empty)."""
        conn = self.conn
        self._channel += 1
        channel = self._channel
        conn.open_channel(channel, _WAIT)
        try:
            conn.consume(channel, self.stream, "spark-first", "first", 1, _WAIT)
            deadline = time.monotonic() + _TAIL_WAIT
            while time.monotonic() < deadline:
                got = [d.offset for d in conn.deliveries if d.channel == channel and d.offset is not None]
                if got:
                    return got[0] + 1
                conn.pump(deadline - time.monotonic())
            return 0
        finally:
            conn.deliveries = [d for d in conn.deliveries if d.channel != channel]
            conn.close_channel(channel, _WAIT)

    def decode(self, payload: bytes) -> Any:
        return jsonlib.loads(payload)

    def close(self) -> None:
        self.conn.close()
