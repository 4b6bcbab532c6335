"""Parsing poll responses, sans-IO: a streamed body cut into JSON arrays, or one JSON array.

A streamed response (``text/plain``) is a run of pieces, each a JSON array followed by ``\\r\\n|\\r\\n``; a
separator inside a payload travels escaped as ``\\r\\n||\\r\\n``. Any other response is one JSON array. Which
one is decided by the response's ``Content-Type``, as the JS client does, never by what was asked for: a proxy
or a server with chunking off answers a streaming request with plain JSON.
"""

from __future__ import annotations

from typing import Any

from shmbus import jsonlib

__all__ = [
    "ESCAPED",
    "MAX_BODY_BYTES",
    "SEPARATOR",
    "AnswerTooLarge",
    "ChunkParser",
    "ProtocolViolation",
    "decode_array",
    "is_streamed",
]

SEPARATOR = b"\r\n|\r\n"
ESCAPED = b"\r\n||\r\n"
#: The default ``max_body_bytes``: the most bytes of one answer, or of one piece of a streamed answer, the client
#: holds. Twice the largest message a shmbus bus of the default size stores (a quarter of its 32 MiB ring), so
#: such a message fits with its envelope; the server bounds what it reads the same way (``MAX_BODY_SIZE``).
MAX_BODY_BYTES = 16 << 20


class ProtocolViolation(ValueError):
    """The server sent something that is not the poll protocol (not a JSON array of message objects)."""


class AnswerTooLarge(ProtocolViolation):
    """An answer, or one piece of a streamed answer, over ``max_body_bytes``: read no further (the connection is
    closed), as a server that never ends a piece would otherwise grow the client's memory without limit."""

    def __init__(self, what: str, limit: int) -> None:
        super().__init__(f"{what} over max_body_bytes ({limit} bytes): not read further")
        self.limit = limit


def is_streamed(content_type: str | None) -> bool:
    """True for a streamed (chunked-protocol) response: anything but ``application/json``."""
    return not (content_type or "").split(";", 1)[0].strip().lower().endswith("json")


def decode_array(payload: bytes) -> list[dict[str, Any]]:
    """One JSON array of message objects; anything else is a :class:`ProtocolViolation`."""
    try:
        items = jsonlib.loads(payload)
    except ValueError as exc:
        raise ProtocolViolation(f"not JSON: {exc} (in {payload[:80]!r})") from None
    if not isinstance(items, list) or not all(isinstance(m, dict) for m in items):
        raise ProtocolViolation(f"not an array of message objects: {payload[:80]!r}")
    return items


class ChunkParser:
    """Feed the bytes of a streamed body as they arrive; get back each complete piece's payload, unescaped. A
    piece longer than ``limit`` bytes is an :class:`AnswerTooLarge` as soon as the buffer holds more."""

    __slots__ = ("_buffer", "_limit", "_scanned")

    def __init__(self, limit: int = MAX_BODY_BYTES) -> None:
        self._buffer = bytearray()
        self._scanned = 0  # bytes of the buffer known to hold no separator start
        self._limit = limit

    def feed(self, data: bytes) -> list[bytes]:
        """The payloads completed by ``data`` (none, one or many), in order."""
        self._buffer += data
        found: list[bytes] = []
        start = 0
        while True:
            end = self._buffer.find(SEPARATOR, max(start, self._scanned))
            if end < 0:
                break
            if end - start > self._limit:
                raise AnswerTooLarge("a piece of a streamed answer", self._limit)
            payload = bytes(self._buffer[start:end])
            found.append(payload.replace(ESCAPED, SEPARATOR) if ESCAPED in payload else payload)
            start = end + len(SEPARATOR)
            self._scanned = start
        if start:
            del self._buffer[:start]
        if len(self._buffer) > self._limit:
            raise AnswerTooLarge("a piece of a streamed answer", self._limit)
        self._scanned = max(len(self._buffer) - len(SEPARATOR) + 1, 0)
        return found

    @property
    def pending(self) -> int:
        """Bytes of an incomplete piece held back (a body that ends with some is truncated)."""
        return len(self._buffer)
