"""AMQP 0-9-1 as bytes, without I/O (h11-like): the frames and methods the RabbitMQ bridge speaks, nothing more.

The bridge's publish path is one ``sendall`` of precomputed frames per batch: a ``basic.publish`` method frame is
the same bytes for every message of a stream (:func:`publish_prefix`), a content header differs only in the body
size, so a message costs one ``struct.pack`` and a join (pika builds, validates and marshals three frame objects
per message). The read side (:class:`FrameReader`) cuts a byte stream into frames; :func:`parse_method` decodes
the handful of methods the bridge uses into plain tuples; :func:`stream_offset` reads the broker's
``x-stream-offset`` header of a stream delivery.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any, NamedTuple

__all__ = [
    "FRAME_END",
    "PROTOCOL_HEADER",
    "FrameReader",
    "Method",
    "encode_table",
    "frame",
    "method_frame",
    "parse_method",
    "publish_frames",
    "publish_prefix",
    "stream_offset",
]

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_END = b"\xce"
METHOD, HEADER, BODY, HEARTBEAT = 1, 2, 3, 8

# (class, method) ids
CONNECTION_START, CONNECTION_START_OK = (10, 10), (10, 11)
CONNECTION_TUNE, CONNECTION_TUNE_OK = (10, 30), (10, 31)
CONNECTION_OPEN, CONNECTION_OPEN_OK = (10, 40), (10, 41)
CONNECTION_CLOSE, CONNECTION_CLOSE_OK = (10, 50), (10, 51)
CONNECTION_BLOCKED, CONNECTION_UNBLOCKED = (10, 60), (10, 61)
CHANNEL_OPEN, CHANNEL_OPEN_OK = (20, 10), (20, 11)
CHANNEL_CLOSE, CHANNEL_CLOSE_OK = (20, 40), (20, 41)
QUEUE_DECLARE, QUEUE_DECLARE_OK = (50, 10), (50, 11)
QUEUE_DELETE, QUEUE_DELETE_OK = (50, 40), (50, 41)
BASIC_QOS, BASIC_QOS_OK = (60, 10), (60, 11)
BASIC_CONSUME, BASIC_CONSUME_OK = (60, 20), (60, 21)
BASIC_CANCEL, BASIC_CANCEL_OK = (60, 30), (60, 31)
BASIC_PUBLISH, BASIC_RETURN, BASIC_DELIVER = (60, 40), (60, 50), (60, 60)
BASIC_ACK, BASIC_NACK = (60, 80), (60, 120)
CONFIRM_SELECT, CONFIRM_SELECT_OK = (85, 10), (85, 11)

_FRAME_HEAD = struct.Struct(">BHI")
_METHOD_HEAD = struct.Struct(">HH")
_CONTENT_HEAD = struct.Struct(">BHIHHQH")  # a frame's head, then class, weight, body size, property flags
_ACK = struct.Struct(">QB")
_OFFSET_KEY = b"\x0fx-stream-offsetl"
_Q = struct.Struct(">q")


class Method(NamedTuple):
    """A decoded method frame: its channel, ``(class, method)`` and arguments (as :func:`parse_method` lists)."""

    channel: int
    kind: tuple[int, int]
    args: tuple[Any, ...]


# ---------------------------------------------------------------------------------------------- encoding
def shortstr(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    if len(raw) > 255:
        raise ValueError(f"AMQP short string longer than 255 bytes: {raw[:40]!r}...")
    return bytes((len(raw),)) + raw


def longstr(raw: bytes) -> bytes:
    return struct.pack(">I", len(raw)) + raw


def _value(value: object) -> bytes:
    if isinstance(value, bool):
        return b"t" + (b"\x01" if value else b"\x00")
    if isinstance(value, int):
        return b"l" + _Q.pack(value)
    if isinstance(value, (str, bytes)):
        return b"S" + longstr(value.encode() if isinstance(value, str) else value)
    if isinstance(value, Mapping):
        return b"F" + encode_table(value)
    raise TypeError(f"no AMQP field type for {type(value).__name__}")


def encode_table(table: Mapping[str, object]) -> bytes:
    body = b"".join(shortstr(k) + _value(v) for k, v in table.items())
    return longstr(body)


def frame(kind: int, channel: int, payload: bytes) -> bytes:
    return _FRAME_HEAD.pack(kind, channel, len(payload)) + payload + FRAME_END


def method_frame(channel: int, kind: tuple[int, int], args: bytes = b"") -> bytes:
    return frame(METHOD, channel, _METHOD_HEAD.pack(*kind) + args)


def publish_prefix(channel: int, routing_key: str, exchange: str = "", mandatory: bool = True) -> bytes:
    """The ``basic.publish`` method frame: the same bytes for every message sent to ``routing_key``."""
    args = b"\x00\x00" + shortstr(exchange) + shortstr(routing_key) + (b"\x01" if mandatory else b"\x00")
    return method_frame(channel, BASIC_PUBLISH, args)


def publish_frames(prefix: bytes, channel: int, bodies: list[bytes], frame_max: int) -> bytes:
    """Every frame of publishing ``bodies`` (a method, a content header with no properties, the body in frames of
    at most ``frame_max``), joined: one ``sendall``."""
    head, end = _CONTENT_HEAD.pack, FRAME_END
    room = frame_max - 8
    parts: list[bytes] = []
    append = parts.append
    for body in bodies:
        n = len(body)
        append(prefix)
        append(head(HEADER, channel, 14, 60, 0, n, 0) + end)
        if not n:
            continue  # no body frame follows an empty content
        if n <= room:
            append(_FRAME_HEAD.pack(BODY, channel, n) + body + end)
        else:
            for i in range(0, n, room):
                piece = body[i : i + room]
                append(_FRAME_HEAD.pack(BODY, channel, len(piece)) + piece + end)
    return b"".join(parts)


# ---------------------------------------------------------------------------------------------- decoding
class FrameReader:
    """Cuts received bytes into ``(type, channel, payload)`` frames; :class:`ValueError` on a malformed one."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0

    def feed(self, data: bytes | memoryview) -> None:
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def frames(self) -> list[tuple[int, int, bytes]]:
        buf, pos, out = self._buf, self._pos, []
        end = len(buf)
        unpack = _FRAME_HEAD.unpack_from
        while end - pos >= 8:
            kind, channel, size = unpack(buf, pos)
            stop = pos + 7 + size
            if stop >= end:
                break
            if buf[stop] != 0xCE:
                raise ValueError("AMQP frame without its end octet: not an AMQP peer, or the stream is corrupt")
            out.append((kind, channel, bytes(buf[pos + 7 : stop])))
            pos = stop + 1
        self._pos = pos
        return out


class _Cursor:
    """Reads AMQP fields from a method's arguments."""

    def __init__(self, raw: bytes, pos: int = 4) -> None:
        self.raw, self.pos = raw, pos

    def take(self, fmt: str) -> Any:
        s = struct.Struct(">" + fmt)
        (value,) = s.unpack_from(self.raw, self.pos)
        self.pos += s.size
        return value

    def shortstr(self) -> bytes:
        n = self.raw[self.pos]
        self.pos += 1 + n
        return self.raw[self.pos - n : self.pos]

    def longstr(self) -> bytes:
        n = self.take("I")
        self.pos += n
        return self.raw[self.pos - n : self.pos]

    def table(self) -> dict[str, Any]:
        raw = self.longstr()
        sub, out = _Cursor(raw, 0), {}
        while sub.pos < len(raw):
            key = sub.shortstr().decode()
            out[key] = sub.value()
        return out

    def value(self) -> Any:
        tag = chr(self.raw[self.pos])
        self.pos += 1
        fixed = {"t": "?", "b": "b", "B": "B", "s": "h", "u": "H", "I": "i", "i": "I", "l": "q", "L": "Q"}
        if tag in fixed:
            return self.take(fixed[tag])
        if tag in "fdT":
            return self.take({"f": "f", "d": "d", "T": "Q"}[tag])
        if tag == "D":
            self.pos += 5
            return None
        if tag in "Sx":
            return self.longstr()
        if tag == "F":
            return self.table()
        if tag == "A":
            raw = self.longstr()
            sub, items = _Cursor(raw, 0), []
            while sub.pos < len(raw):
                items.append(sub.value())
            return items
        if tag == "V":
            return None
        raise ValueError(f"unknown AMQP field type {tag!r}")


def parse_method(channel: int, payload: bytes) -> Method:
    """The method in ``payload`` with the arguments the bridge reads (others: none)."""
    kind = _METHOD_HEAD.unpack_from(payload)
    c = _Cursor(payload)
    args: tuple[Any, ...] = ()
    if kind in (BASIC_ACK, BASIC_NACK):
        args = _ACK.unpack_from(payload, 4)  # delivery tag, bits (multiple first)
    elif kind == BASIC_DELIVER:
        args = (c.shortstr(), c.take("Q"))  # consumer tag, delivery tag
    elif kind in (CONNECTION_CLOSE, CHANNEL_CLOSE):
        args = (c.take("H"), c.shortstr().decode(errors="replace"), c.take("H"), c.take("H"))
    elif kind == CONNECTION_TUNE:
        args = (c.take("H"), c.take("I"), c.take("H"))  # channel max, frame max, heartbeat
    elif kind == CONNECTION_START:
        c.pos += 2
        c.table()
        args = (c.longstr().split(),)  # mechanisms
    elif kind == QUEUE_DECLARE_OK:
        args = (c.shortstr(), c.take("I"), c.take("I"))
    elif kind in (BASIC_CONSUME_OK, BASIC_CANCEL):
        args = (c.shortstr(),)
    elif kind == BASIC_RETURN:
        args = (c.take("H"), c.shortstr().decode(errors="replace"))
    return Method(channel, kind, args)


def stream_offset(header: bytes) -> int | None:
    """The ``x-stream-offset`` the broker put in a stream delivery's headers (None: not a stream delivery).

    The table's top-level keys are walked (a publisher's own header value may hold the same bytes); the broker
    replaces a publisher's ``x-stream-offset`` with its own (checked against RabbitMQ 3.10)."""
    flags = int.from_bytes(header[12:14], "big")
    if not flags & 0x2000:  # no headers
        return None
    pos = 14
    if flags & 0x8000:
        pos += 1 + header[pos]
    if flags & 0x4000:
        pos += 1 + header[pos]
    (size,) = struct.unpack_from(">I", header, pos)
    c = _Cursor(header, pos + 4)
    end = pos + 4 + size
    while c.pos < end:
        if header.startswith(_OFFSET_KEY, c.pos):
            return int(_Q.unpack_from(header, c.pos + len(_OFFSET_KEY))[0])
        c.shortstr()
        c.value()
    return None


def body_size(header: bytes) -> int:
    """The body size a content header announces."""
    return int(struct.unpack_from(">Q", header, 4)[0])
