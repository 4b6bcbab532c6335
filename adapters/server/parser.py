"""A small, strict HTTP/1.x request parser with httptools' callback interface (used when httptools is missing).

Why its own: :mod:`shmbus.adapters.server` drives httptools' ``HttpRequestParser`` (callbacks on a protocol
object); this class has the same surface (``feed_data``, ``get_method``, ``get_http_version``,
``should_keep_alive`` and the ``on_*`` callbacks), so the server has one code path. Strict where laxness is a
smuggling risk: ``Transfer-Encoding`` together with ``Content-Length``, differing ``Content-Length`` values,
a transfer coding other than a final ``chunked``, obsolete line folding and anything but HTTP/1.0 and 1.1 are
errors.
"""

from __future__ import annotations

import os
import re
from typing import Any

__all__ = ["HttpParserError", "HttpParserUpgrade", "HttpRequestParser"]


class HttpParserError(Exception):
    """Malformed request (the server answers 400 and closes)."""


class HttpParserUpgrade(Exception):
    """Never raised here (kept so the server's ``except`` clauses are the same as with httptools)."""


_REQUEST_LINE = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+) (\S+) HTTP/1\.([01])\Z")
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")
_HEX = re.compile(rb"[0-9A-Fa-f]{1,15}\Z")

_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILER = range(6)
MAX_HEAD = 1 << 16


class HttpRequestParser:
    """Feed bytes; calls ``on_message_begin``, ``on_url``, ``on_header``, ``on_headers_complete``, ``on_body``,
    ``on_message_complete`` on ``protocol`` (each optional)."""

    def __init__(self, protocol: Any) -> None:
        self._p = protocol
        self._buf = b""
        self._state = _HEAD
        self._left = 0
        self._method = b""
        self._minor = 1
        self._keep = True
        self._begun = False  # on_message_begin was called for the head being read

    def get_method(self) -> bytes:
        return self._method

    def get_http_version(self) -> str:
        return f"1.{self._minor}"

    def should_keep_alive(self) -> bool:
        return self._keep

    def _take_body(self, buf: bytes, pos: int, n: int) -> int:
        """Hand the body bytes at ``pos`` (at most ``self._left``) to the protocol; the new position."""
        take = min(self._left, n - pos)
        self._body(buf[pos : pos + take])
        self._left -= take
        return pos + take

    def feed_data(self, data: bytes) -> None:
        buf = self._buf + data if self._buf else data
        self._buf = b""
        pos = 0
        n = len(buf)
        while pos < n:
            st = self._state
            if st == _HEAD:
                if buf[pos] in (13, 10):  # stray CRLF between requests (RFC 9112 §2.2)
                    pos += 1
                    continue
                if not self._begun:  # as httptools: at the head's first byte, so its deadline starts then
                    self._begun = True
                    self._call("on_message_begin")
                end = buf.find(b"\r\n\r\n", pos)
                if end < 0:
                    if n - pos > MAX_HEAD:
                        raise HttpParserError("request head too large")
                    break
                self._head(buf[pos:end])
                pos = end + 4
            elif st == _LENGTH:
                pos = self._take_body(buf, pos, n)
                if not self._left:
                    self._complete()
            elif st == _CHUNK_SIZE:
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    if n - pos > 1024:
                        raise HttpParserError("chunk size line too long")
                    break
                size = buf[pos:end].split(b";", 1)[0].strip()
                if not _HEX.match(size):
                    raise HttpParserError("invalid chunk size")
                self._left = int(size, 16)
                pos = end + 2
                self._state = _CHUNK_DATA if self._left else _TRAILER
            elif st == _CHUNK_DATA:
                pos = self._take_body(buf, pos, n)
                if not self._left:
                    self._state = _CHUNK_END
            elif st == _CHUNK_END:
                if n - pos < 2:
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    raise HttpParserError("missing CRLF after chunk data")
                pos += 2
                self._state = _CHUNK_SIZE
            else:  # _TRAILER: trailer fields (ignored) up to an empty line
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    if n - pos > MAX_HEAD:
                        raise HttpParserError("trailer too large")
                    break
                line = buf[pos:end]
                pos = end + 2
                if not line:
                    self._complete()
        if pos < n:
            self._buf = buf[pos:]

    def _call(self, name: str, *args: Any) -> None:
        fn = getattr(self._p, name, None)
        if fn is not None:
            fn(*args)

    def _body(self, data: bytes) -> None:
        if data:
            self._call("on_body", data)

    def _complete(self) -> None:
        self._state = _HEAD
        self._begun = False
        self._call("on_message_complete")

    def _head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        m = _REQUEST_LINE.match(lines[0])
        if m is None:
            raise HttpParserError("malformed request line")
        self._method = m.group(1)
        self._minor = int(m.group(3))
        headers = []
        length: int | None = None
        te: bytes | None = None
        conn: list[bytes] = []
        for line in lines[1:]:
            if not line or line[0] in (32, 9):
                raise HttpParserError("obsolete line folding or empty header line")
            name, sep, value = line.partition(b":")
            if not sep or not _TOKEN.match(name):
                raise HttpParserError("malformed header line")
            value = value.strip(b" \t")
            if b"\n" in value or b"\r" in value or b"\x00" in value:
                raise HttpParserError("invalid character in header value")
            low = name.lower()
            if low == b"content-length":
                if not value.isdigit() or len(value) > 18:
                    raise HttpParserError("invalid Content-Length")
                v = int(value)
                if length is not None and length != v:
                    raise HttpParserError("conflicting Content-Length headers")
                length = v
            elif low == b"transfer-encoding":
                te = value if te is None else te + b"," + value
            elif low == b"connection":
                conn += [t.strip().lower() for t in value.split(b",")]
            headers.append((name, value))
        chunked = False
        if te is not None:
            if length is not None:
                raise HttpParserError("both Transfer-Encoding and Content-Length")
            codings = [t.strip().lower() for t in te.split(b",")]
            if codings[-1] != b"chunked" or codings.count(b"chunked") != 1 or self._minor == 0:
                raise HttpParserError("unsupported Transfer-Encoding")
            chunked = True
        if self._minor == 1:
            self._keep = b"close" not in conn
        else:
            self._keep = b"keep-alive" in conn and b"close" not in conn
        self._call("on_url", m.group(2))
        for name, value in headers:
            self._call("on_header", name, value)
        self._call("on_headers_complete")
        if chunked:
            self._state = _CHUNK_SIZE
        elif length:
            self._state = _LENGTH
            self._left = length
        else:
            self._complete()


#: The parser in use: httptools when importable (and ``SHMBUS_SERVER_PARSER`` is not ``pure``), else this module's.
Parser: Any = HttpRequestParser
ParserError: Any = HttpParserError
ParserUpgrade: Any = HttpParserUpgrade
PARSER = "pure"
httptools: Any = None
if os.environ.get("SHMBUS_SERVER_PARSER") != "pure":
    try:
        import httptools as _httptools
    except ImportError:  # pragma: no cover - httptools is in the web extra
        pass
    else:
        httptools = _httptools
        Parser, ParserError, ParserUpgrade = (
            _httptools.HttpRequestParser,
            _httptools.HttpParserError,
            _httptools.HttpParserUpgrade,
        )
        PARSER = "httptools"
