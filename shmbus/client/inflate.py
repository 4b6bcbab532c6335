"""Undoing a response's ``Content-Encoding`` in bounded steps, sans-IO.

httpx inflates a gzip or deflate body in one call per network read: 64 KiB of a compressed run of zeros becomes
64 MiB at once, before anything can count it. Here each step yields at most ``piece`` bytes, so a reader that
stops at its limit has held at most the limit and one piece, whatever the ratio (a "gzip bomb").
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

from .chunks import ProtocolViolation

__all__ = ["ACCEPT_ENCODING", "PIECE", "Inflater"]

#: what the client asks for (brotli or zstd, which httpx would add when installed, are not undone here)
ACCEPT_ENCODING = "gzip, deflate"
#: the most bytes one step yields
PIECE = 64 * 1024
_GZIP = 16 + zlib.MAX_WBITS


class Inflater:
    """``feed(data)`` and, at the end, ``flush()`` yield the decoded body in pieces of at most ``piece`` bytes.
    An encoding other than gzip, deflate or identity, or a corrupt body, is a :class:`ProtocolViolation`."""

    __slots__ = ("_piece", "_raw_retry", "_z")

    def __init__(self, content_encoding: str | None, piece: int = PIECE) -> None:
        codings = [c.strip().lower() for c in (content_encoding or "").split(",")]
        codings = [c for c in codings if c and c != "identity"]
        self._piece = piece
        self._z: zlib._Decompress | None = None
        self._raw_retry = False
        if not codings:
            return
        if len(codings) > 1 or codings[0] not in ("gzip", "x-gzip", "deflate"):
            raise ProtocolViolation(f"Content-Encoding {content_encoding!r} (asked for {ACCEPT_ENCODING})")
        # "deflate" is zlib-wrapped, but some servers send it raw: tried once, on the first bytes
        self._raw_retry = codings[0] == "deflate"
        self._z = zlib.decompressobj(zlib.MAX_WBITS if self._raw_retry else _GZIP)

    def feed(self, data: bytes) -> Iterator[bytes]:
        if self._z is None:
            if len(data) <= self._piece:
                yield data
            else:
                for i in range(0, len(data), self._piece):
                    yield data[i : i + self._piece]
            return
        try:
            yield from self._inflate(data)
        except zlib.error as exc:
            if not self._raw_retry:
                raise ProtocolViolation(f"a corrupt compressed body: {exc}") from None
            self._raw_retry = False
            self._z = zlib.decompressobj(-zlib.MAX_WBITS)
            yield from self.feed(data)
        self._raw_retry = False

    def _inflate(self, data: bytes) -> Iterator[bytes]:
        z = self._z
        assert z is not None
        while True:
            out = z.decompress(data, self._piece)
            data = z.unconsumed_tail
            if out:
                yield out
            if not data and len(out) < self._piece:  # all input taken, and no output held back
                return

    def flush(self) -> Iterator[bytes]:
        """What the decoder still holds at the end of the body (a body cut short is not an error here: the
        parser finds the piece it leaves incomplete)."""
        if self._z is not None:
            out = self._z.flush()
            for i in range(0, len(out), self._piece):
                yield out[i : i + self._piece]
