"""The NATS client protocol, sans I/O: the commands a client writes and a parser of what the server sends.

The protocol is text lines and sized payloads (``INFO``, ``MSG``, ``HMSG``, ``PING``, ``PONG``, ``+OK``, ``-ERR``
from the server; ``CONNECT``, ``PUB``, ``HPUB``, ``SUB``, ``UNSUB``, ``PING``, ``PONG`` from the client), small
enough that the bridge speaks it itself on a plain blocking socket (:mod:`.client`): the kit is threaded and
synchronous, and writing a batch of publishes as one ``sendall`` then reading their acknowledgements is what makes
the bridge's publish cheap (see :mod:`.bridge`). :class:`Parser` takes bytes as they come and returns whole
operations; nothing here reads a socket or a clock.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

__all__ = ["Msg", "Parser", "NatsProtocolError", "connect_op", "parse_headers", "pub_op", "sub_op"]

_CRLF = b"\r\n"
_MAX_CONTROL = 64 * 1024  # a control line longer than this is no NATS server's


class NatsProtocolError(Exception):
    """The server sent something that is not the NATS protocol (or an ``-ERR``): the connection is unusable."""


class Msg(NamedTuple):
    """A delivered message: ``status`` is the header line's status code (``b"404"``, ``b"503"``...; ``b""``
    without headers or status)."""

    subject: bytes
    sid: bytes
    reply: bytes
    headers: bytes  #: the raw header block (``NATS/1.0 ...\r\nKey: value\r\n\r\n``); ``b""``: none
    payload: bytes
    status: bytes


PING = ("PING",)
PONG = ("PONG",)
OK = ("OK",)


def connect_op(options: dict[str, Any]) -> bytes:
    return b"CONNECT " + json.dumps(options, separators=(",", ":")).encode() + _CRLF


def pub_op(subject: bytes, reply: bytes, payload: bytes) -> bytes:
    if reply:
        return b"PUB %s %s %d\r\n%s\r\n" % (subject, reply, len(payload), payload)
    return b"PUB %s %d\r\n%s\r\n" % (subject, len(payload), payload)


def sub_op(subject: bytes, sid: int) -> bytes:
    return b"SUB %s %d\r\n" % (subject, sid)


def parse_headers(block: bytes) -> dict[bytes, bytes]:
    """A header block as a dict (the last value of a repeated key); the status line is skipped."""
    out: dict[bytes, bytes] = {}
    for line in block.split(_CRLF)[1:]:
        key, sep, value = line.partition(b":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def _status(block: bytes) -> bytes:
    first = block.split(_CRLF, 1)[0]  # NATS/1.0 [code [description]]
    parts = first.split(b" ", 2)
    return parts[1] if len(parts) > 1 else b""


class Parser:
    """Bytes in (:meth:`feed`), operations out: :class:`Msg`, ``("PING",)``, ``("PONG",)``, ``("OK",)``,
    ``("INFO", dict)``; an ``-ERR`` raises :class:`NatsProtocolError` unless it is one the server sends and goes on
    after (``Permissions Violation``), which comes out as ``("ERR", text)``."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self._pending: tuple[bytes, bytes, bytes, int, int] | None = None  # a MSG's header: waiting for its bytes

    def feed(self, data: bytes) -> list[Any]:
        buf = self.buf
        buf += data
        out: list[Any] = []
        pos = 0
        n = len(buf)
        while pos < n:
            pending = self._pending
            if pending is not None:
                subject, sid, reply, hlen, total = pending
                end = pos + total
                if end + 2 > n:
                    break
                body = bytes(buf[pos:end])
                if hlen:
                    block = body[:hlen]
                    out.append(Msg(subject, sid, reply, block, body[hlen:], _status(block)))
                else:
                    out.append(Msg(subject, sid, reply, b"", body, b""))
                pos = end + 2
                self._pending = None
                continue
            eol = buf.find(_CRLF, pos)
            if eol < 0:
                if n - pos > _MAX_CONTROL:
                    raise NatsProtocolError("a control line longer than 64 KiB")
                break
            line = bytes(buf[pos:eol])
            pos = eol + 2
            op = line[:4].upper()
            if op == b"MSG ":
                self._pending = _msg_header(line, False)
            elif op == b"HMSG":
                self._pending = _msg_header(line, True)
            elif op == b"PING":
                out.append(PING)
            elif op == b"PONG":
                out.append(PONG)
            elif op == b"+OK":
                out.append(OK)
            elif op == b"INFO":
                out.append(("INFO", json.loads(line[5:])))
            elif op == b"-ERR":
                text = line[4:].strip().strip(b"'").decode(errors="replace")
                if text.lower().startswith("permissions violation"):
                    out.append(("ERR", text))
                else:
                    raise NatsProtocolError(f"server error: {text}")
            elif line:
                raise NatsProtocolError(f"unexpected line from the server: {line[:80]!r}")
        del buf[:pos]
        return out


def _msg_header(line: bytes, headers: bool) -> tuple[bytes, bytes, bytes, int, int]:
    """``MSG subject sid [reply] size`` / ``HMSG subject sid [reply] hsize size`` -> the parts."""
    parts = line.split()
    try:
        if headers:
            if len(parts) == 5:
                return parts[1], parts[2], b"", int(parts[3]), int(parts[4])
            return parts[1], parts[2], parts[3], int(parts[4]), int(parts[5])
        if len(parts) == 4:
            return parts[1], parts[2], b"", 0, int(parts[3])
        return parts[1], parts[2], parts[3], 0, int(parts[4])
    except (IndexError, ValueError) as exc:
        raise NatsProtocolError(f"malformed message line: {line[:80]!r}") from exc
